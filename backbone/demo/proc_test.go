package demo

import (
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

func shell(t *testing.T, script string) *Proc {
	t.Helper()
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh:", err)
	}
	p, err := Start("sh", nil, nil, sh, "-c", script)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p
}

// TestAwait: a line printed before and one printed after Await starts are
// both found, with their submatches; a process that exits without the line
// gives ErrExited with its last lines; a context that ends gives its error.
func TestAwait(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p := shell(t, `echo "hub: listening on 127.0.0.1:4242, backbone x"; sleep 0.3; echo "second 17"; sleep 30`)
	m, err := p.Await(ctx, hubListening)
	if err != nil || m[1] != "127.0.0.1:4242" {
		t.Fatalf("Await = %q, %v", m, err)
	}
	m, err = p.Await(ctx, regexp.MustCompile(`^second (\d+)$`))
	if err != nil || m[1] != "17" {
		t.Fatalf("Await = %q, %v", m, err)
	}
	short, cancel2 := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel2()
	if _, err := p.Await(short, regexp.MustCompile(`never`)); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Await past the deadline: %v", err)
	}

	q := shell(t, `echo "about to fail"; exit 3`)
	if _, err := q.Await(ctx, gatewayListening); !errors.Is(err, ErrExited) || !strings.Contains(err.Error(), "about to fail") {
		t.Errorf("Await on an exited process: %v", err)
	}
	var ee *exec.ExitError
	if !errors.As(q.Err(), &ee) || ee.ExitCode() != 3 {
		t.Errorf("Err = %v, want exit status 3", q.Err())
	}
}

// TestStop: a child that exits on SIGTERM stops at once with status 0; one
// that ignores SIGTERM is killed after the grace period.
func TestStop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p := shell(t, `trap 'exit 0' TERM; echo ready; while :; do sleep 0.05; done`)
	if _, err := p.Await(ctx, regexp.MustCompile(`^ready$`)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := p.Stop(5 * time.Second); err != nil || time.Since(start) > 3*time.Second {
		t.Errorf("Stop = %v after %v", err, time.Since(start))
	}
	q := shell(t, `trap '' TERM; echo ready; while :; do sleep 0.05; done`)
	if _, err := q.Await(ctx, regexp.MustCompile(`^ready$`)); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	err := q.Stop(300 * time.Millisecond)
	if el := time.Since(start); err == nil || el < 300*time.Millisecond || el > 5*time.Second {
		t.Errorf("Stop of a child ignoring SIGTERM = %v after %v; want killed after the 300 ms grace", err, el)
	}
	select {
	case <-q.Done():
	default:
		t.Error("not done after Stop")
	}
}

// TestPrefixLine: text lines get "[name] ", JSON objects a "role" field
// (still one JSON object per line), anything else that looks like JSON but
// is not stays text.
func TestPrefixLine(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"hub: listening on 127.0.0.1:7001, ledger x", "[hub] hub: listening on 127.0.0.1:7001, ledger x"},
		{`{"time":"t","level":"INFO","msg":"session started"}`, `{"role":"hub","time":"t","level":"INFO","msg":"session started"}`},
		{`{}`, `{"role":"hub"}`},
		{`{not json}`, `[hub] {not json}`},
		{``, `[hub] `},
	} {
		got := prefixLine("hub", c.in)
		if got != c.want {
			t.Errorf("prefixLine(%q) = %q, want %q", c.in, got, c.want)
		}
		if strings.HasPrefix(c.want, "{") && !json.Valid([]byte(got)) {
			t.Errorf("prefixLine(%q) = %q: not JSON", c.in, got)
		}
	}
}
