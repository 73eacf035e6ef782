package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/engine/demomodel"
	"github.com/kvasir-ai/kvasir/engine/slice"
)

// TestWorkerCommandFlags runs `backbone worker` on flags that cannot work:
// each exits at once, non-zero, naming the flag. --layers that select no
// expert of the slice used to connect a worker serving nothing
// (accepted=0); --layers with --quota was silently ignored; "4GB" was
// refused although the contributor app took it (now both read
// engine/bytesize); a second quota worker on a folder another one holds
// deleted that one's experts (now slice.ErrInUse).
func TestWorkerCommandFlags(t *testing.T) {
	dir := t.TempDir()
	f, err := demomodel.File()
	if err != nil {
		t.Fatal(err)
	}
	sl := filepath.Join(dir, "s0")
	if _, err := slice.Cut(f, []int{0}, nil, sl); err != nil {
		t.Fatal(err)
	}
	held := filepath.Join(dir, "held")
	st, _, err := slice.OpenStore(held, 1<<20, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	gw := []string{"worker", "--gateway", "wss://127.0.0.1:1", "--key", filepath.Join(dir, "w.key")}
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--slice", sl, "--layers", "9"}, 1, "--layers [9]: the slice holds no expert of these layers"},
		{[]string{"--slice", filepath.Join(dir, "q"), "--quota", "4MiB", "--layers", "0"}, 2, "--layers does not apply with --quota"},
		{[]string{"--slice", filepath.Join(dir, "q"), "--quota", "4GX"}, 2, `--quota: bad byte count "4GX"`},
		{[]string{"--quota", "4GB"}, 2, "--quota needs --gateway and a --slice directory"},
		{[]string{"--slice", held, "--quota", "4GB"}, 1, "in use by another worker"},
		{[]string{"--slice", sl, "--model-tiny"}, 2, "--slice and --model-tiny exclude each other"},
		{[]string{"--slice", sl, "--threads", "-1"}, 2, "--threads -1: want >= 0 (0 = all CPUs)"},
	} {
		cmd := exec.Command(backboneBin(t), append(gw, c.args...)...)
		cmd.Env = append(os.Environ(), asBackbone)
		cmd.WaitDelay = 5 * time.Second
		done := make(chan struct{})
		timer := time.AfterFunc(20*time.Second, func() { _ = cmd.Process.Kill(); close(done) })
		out, err := cmd.CombinedOutput()
		timer.Stop()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != c.code || !strings.Contains(string(out), c.want) {
			t.Errorf("worker %v: %v, output %q; want exit %d and %q", c.args, err, out, c.code, c.want)
		}
		select {
		case <-done:
			t.Errorf("worker %v did not exit", c.args)
		default:
		}
	}
}
