package instance

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

const childDir = "KVASIR_INSTANCE_CHILD" // data folder for the child process

// TestMain lets the test binary act as a second launch: with
// KVASIR_INSTANCE_CHILD=DIR it acquires DIR (holding it for
// KVASIR_INSTANCE_HOLD if set, else printing the error and exiting 3).
func TestMain(m *testing.M) {
	if dir := os.Getenv(childDir); dir != "" {
		l, err := Acquire(dir, nil)
		if err != nil {
			fmt.Println(err)
			os.Exit(3)
		}
		fmt.Println("acquired")
		if d, err := time.ParseDuration(os.Getenv("KVASIR_INSTANCE_HOLD")); err == nil {
			time.Sleep(d)
		}
		l.Release()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func child(t *testing.T, dir string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childDir+"="+dir), env...)
	return cmd
}

// TestSecondLaunchShowsFirst: while this process holds a data folder, a
// second process on the same folder exits with a message and makes the
// first show its window; another folder is independent; after Release the
// folder is free again.
func TestSecondLaunchShowsFirst(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "kvasir")
	var shown atomic.Int32
	l, err := Acquire(dir, func() { shown.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	out, err := child(t, dir).Output()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("second launch: %v, output %q", err, out)
	}
	want := fmt.Sprintf("kvasir is already running for the data folder %s (process %d): its window was brought to the front", dir, os.Getpid())
	if strings.TrimSpace(string(out)) != want {
		t.Errorf("second launch says %q\nwant %q", out, want)
	}
	if shown.Load() != 1 {
		t.Errorf("the first instance was asked to show %d times, want 1", shown.Load())
	}
	// In this process too: a second Acquire is refused.
	if _, err := Acquire(dir, nil); !errors.Is(err, ErrRunning) {
		t.Errorf("second Acquire in-process: %v", err)
	}
	if shown.Load() != 2 {
		t.Errorf("shown %d times, want 2", shown.Load())
	}
	// Another data folder is another instance.
	if out, err := child(t, t.TempDir()).Output(); err != nil || strings.TrimSpace(string(out)) != "acquired" {
		t.Errorf("another folder: %v %q", err, out)
	}
	// A wrong token is refused without showing anything.
	b, _ := os.ReadFile(filepath.Join(dir, InfoFile))
	var in info
	if err := json.Unmarshal(b, &in); err != nil {
		t.Fatal(err)
	}
	in.Token = "guess"
	if _, err := ask(in); err == nil || shown.Load() != 2 {
		t.Errorf("a wrong token: %v, shown %d", err, shown.Load())
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, InfoFile)); !os.IsNotExist(err) {
		t.Errorf("instance.json left after Release: %v", err)
	}
	if out, err := child(t, dir).Output(); err != nil || strings.TrimSpace(string(out)) != "acquired" {
		t.Errorf("after Release: %v %q", err, out)
	}
	_ = l.Release() // twice is harmless
}

// TestCrashedInstanceFreesTheFolder: a holder killed with SIGKILL leaves
// its instance.json behind, but the OS drops its lock: the next launch
// takes the folder.
func TestCrashedInstanceFreesTheFolder(t *testing.T) {
	dir := t.TempDir()
	cmd := child(t, dir, "KVASIR_INSTANCE_HOLD=1m")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 9)
	if _, err := out.Read(buf); err != nil || string(buf) != "acquired\n" {
		t.Fatalf("holder: %q %v", buf, err)
	}
	if _, err := Acquire(dir, nil); !errors.Is(err, ErrRunning) {
		t.Fatalf("while held: %v", err)
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	if _, err := os.Stat(filepath.Join(dir, InfoFile)); err != nil {
		t.Fatalf("the killed holder's instance.json: %v", err)
	}
	l, err := Acquire(dir, nil)
	if err != nil {
		t.Fatalf("after the holder died: %v", err)
	}
	l.Release()
}
