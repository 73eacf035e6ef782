package run

import (
	"flag"
	"io"
	"testing"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
)

// TestVerifyFlag: --verify takes spot or quorum (default spot) and sets
// dispatch.Config.Verify; anything else is a flag error.
func TestVerifyFlag(t *testing.T) {
	for args, want := range map[string]dispatch.VerifyMode{"": "", "spot": dispatch.VerifySpot, "quorum": dispatch.VerifyQuorum} {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		sf := AddSwarmFlags(fs)
		var argv []string
		if args != "" {
			argv = []string{"--verify", args}
		}
		if err := fs.Parse(argv); err != nil || sf.Check() != nil {
			t.Fatalf("%q: %v %v", args, err, sf.Check())
		}
		var c dispatch.Config
		sf.tune(&c)
		if c.Verify != want {
			t.Fatalf("%q: Verify %q, want %q", args, c.Verify, want)
		}
	}
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	AddSwarmFlags(fs)
	if err := fs.Parse([]string{"--verify", "majority"}); err == nil {
		t.Fatal("--verify majority accepted")
	}
}
