package run

import (
	"context"
	"flag"
	"io"
	"math"
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

// TestCheckFlags: the verification flags take finite values in range and
// name the flag otherwise; NaN and Inf, which the float parser accepts,
// are refused (a NaN tolerance failed every honest GPU answer and banned
// the worker, an infinite one passed every answer, a NaN rate turned
// checks off). The dispatcher refuses the same values from a Config.
func TestCheckFlags(t *testing.T) {
	for _, ok := range [][]string{nil, {"--check-tolerance", "0.01"}, {"--check-tolerance", "-1"}, {"--check-tolerance", "0.5"},
		{"--check-rate", "0"}, {"--check-rate", "1"}, {"--check-probation", "0"}} {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		sf := AddSwarmFlags(fs)
		if err := fs.Parse(ok); err != nil || sf.Check() != nil {
			t.Errorf("%q: %v %v", ok, err, sf.Check())
		}
	}
	for _, bad := range [][]string{{"--check-tolerance", "NaN"}, {"--check-tolerance", "Inf"}, {"--check-tolerance", "-Inf"},
		{"--check-tolerance", "0"}, {"--check-tolerance", "0.6"}, {"--check-rate", "NaN"}, {"--check-rate", "1.5"},
		{"--check-rate", "-0.1"}, {"--check-probation", "-1"}, {"--ban-for", "0s"}} {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		sf := AddSwarmFlags(fs)
		if err := fs.Parse(bad); err != nil {
			t.Fatalf("%q: %v", bad, err)
		}
		if err := sf.Check(); err == nil || !strings.Contains(err.Error(), bad[0]+" ") {
			t.Errorf("%q: Check = %v, want an error naming the flag", bad, err)
		}
	}
	m := dispatch.Model{ID: "m", D: 16, K: 2, NLayer: 1, NExpert: 4}
	d, err := dispatch.New(dispatch.Config{Model: m, Listen: "127.0.0.1:0", Fallback: nopExperts{}, Tolerance: 0.01, CheckRate: 0.5})
	if err != nil {
		t.Fatalf("dispatch.New with tolerance 0.01, check rate 0.5: %v", err)
	}
	d.Close()
	for _, c := range []dispatch.Config{{Tolerance: math.NaN()}, {Tolerance: math.Inf(1)}, {Tolerance: 0.9}, {CheckRate: math.NaN()}, {CheckRate: math.Inf(1)}} {
		c.Model, c.Listen, c.Fallback = m, "127.0.0.1:0", nopExperts{}
		if d, err := dispatch.New(c); err == nil {
			d.Close()
			t.Errorf("dispatch.New with tolerance %v, check rate %v: accepted", c.Tolerance, c.CheckRate)
		}
	}
}

// nopExperts is an expert.Computer that computes nothing (a Fallback for
// configurations that are never started).
type nopExperts struct{}

func (nopExperts) ComputeExperts(context.Context, int, []float32, []int32, int, int, []float32) error {
	return nil
}
