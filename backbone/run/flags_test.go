package run

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"

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

// TestSpinWaitFlag: --spin-wait defaults to dispatch.DefaultSpinWait and
// passes it on; 0 turns spinning off (SpinWait negative in the
// dispatcher's config, where 0 means the default); a negative duration is
// refused by Check and a malformed one by the parser.
func TestSpinWaitFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want time.Duration
	}{{nil, dispatch.DefaultSpinWait}, {[]string{"--spin-wait", "0"}, -1}, {[]string{"--spin-wait", "250ms"}, 250 * time.Millisecond}} {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		sf := AddSwarmFlags(fs)
		if err := fs.Parse(tc.args); err != nil || sf.Check() != nil {
			t.Fatalf("%q: %v %v", tc.args, err, sf.Check())
		}
		var c dispatch.Config
		sf.tune(&c)
		if c.SpinWait != tc.want {
			t.Fatalf("%q: SpinWait %v, want %v", tc.args, c.SpinWait, tc.want)
		}
	}
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	sf := AddSwarmFlags(fs)
	if err := fs.Parse([]string{"--spin-wait", "-1s"}); err != nil {
		t.Fatal(err)
	}
	if err := sf.Check(); err == nil || !strings.Contains(err.Error(), "--spin-wait -1s") {
		t.Fatalf("--spin-wait -1s: Check = %v", err)
	}
	fs = flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	AddSwarmFlags(fs)
	for _, bad := range []string{"fast", "10", "1e999s", ""} {
		if err := fs.Parse([]string{"--spin-wait", bad}); err == nil {
			t.Errorf("--spin-wait %q accepted", bad)
		}
	}
}
