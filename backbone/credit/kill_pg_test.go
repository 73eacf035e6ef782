//go:build unix

package credit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/ledger"
	"github.com/kvasir-ai/kvasir/backbone/pgstore/pgtest"
)

// helperHubBatch is a hub flushing its sessions as the real one does: one
// AppendAll per round with a row per session, each row numbered in its
// session (Seq); a failed append is sent again unchanged. After each
// commit it prints "ok session seq worker in out rejected" per row.
func helperHubBatch() int {
	l, err := ledger.Open(os.Getenv("KVASIR_LEDGER"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	rng := rand.New(rand.NewPCG(uint64(os.Getpid()), uint64(time.Now().UnixNano())))
	const sessions = 6
	seq := make([]uint64, sessions)
	for {
		es := make([]ledger.Entry, 0, sessions)
		for i := range sessions {
			if rng.IntN(3) == 0 {
				continue
			}
			seq[i]++
			es = append(es, ledger.Entry{SessionID: fmt.Sprintf("p%d-%d", os.Getpid(), i), Seq: seq[i], WorkerID: workerID(i % 4),
				BytesIn: uint64(rng.IntN(100000)), BytesOut: uint64(rng.IntN(100000)), RejectedBytes: uint64(rng.IntN(2) * rng.IntN(1000))})
		}
		for {
			if err := l.AppendAll(context.Background(), es); err == nil {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		var b strings.Builder
		for _, e := range es {
			fmt.Fprintf(&b, "ok %s %d %s %d %d %d\n", e.SessionID, e.Seq, e.WorkerID, e.BytesIn, e.BytesOut, e.RejectedBytes)
		}
		fmt.Print(b.String())
		time.Sleep(time.Duration(rng.IntN(4)) * time.Millisecond)
	}
}

// proc is a helper process and the lines it printed.
type proc struct {
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []string
	seen  chan string // every line, for waiting on one
	done  chan struct{}
}

func startProc(t *testing.T, mode string, env ...string) *proc {
	t.Helper()
	cmd, lines := startHelper(t, mode, env...)
	p := &proc{cmd: cmd, seen: make(chan string, 1<<16), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for l := range lines {
			p.mu.Lock()
			p.lines = append(p.lines, l)
			p.mu.Unlock()
			select {
			case p.seen <- l:
			default:
			}
		}
	}()
	return p
}

// killNow SIGKILLs the process, waits for it and returns its lines.
func (p *proc) killNow(t *testing.T) []string {
	kill(t, p.cmd)
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lines
}

// TestKillTwoHubsTwoGateways: two hub processes append batches to one
// PostgreSQL ledger while two gateway processes credit one PostgreSQL
// wallets store, each gateway reading the ledger through its own hub
// endpoint; for several seconds a random one of the four is SIGKILLed
// (often a gateway inside its transaction, a hub at any moment) and
// restarted. Then the hubs stop, a gateway finishes, and every worker has
// been credited exactly rate x its creditable bytes in the ledger, with
// every acknowledged row there unchanged and every statement chain whole.
func TestKillTwoHubsTwoGateways(t *testing.T) {
	dsn := pgtest.DSN(t)
	dur := 6 * time.Second
	if testing.Short() {
		dur = 2 * time.Second
	}
	l, err := ledger.Open(dsn) // creates the schema before the children race to
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if s, err := Open(Config{Path: dsn, Source: l}); err != nil {
		t.Fatal(err)
	} else {
		s.Close()
	}
	auth := func(r *http.Request) bool { return r.Header.Get("X-Test-Auth") == "yes" }
	var endpoints []string
	for range 2 { // the two hubs' ledger endpoints, each on its own pool
		lr, err := ledger.OpenReadOnly(dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer lr.Close()
		srv := httptest.NewServer(ledger.Handler(lr, auth))
		defer srv.Close()
		endpoints = append(endpoints, srv.URL)
	}
	hubEnv := []string{"KVASIR_LEDGER=" + dsn}
	gwEnv := func(i int) []string {
		return []string{"KVASIR_LEDGER_URL=" + endpoints[i], "KVASIR_WALLETS=" + dsn, "KVASIR_CREDIT_LOOP=1"}
	}
	hubs := []*proc{startProc(t, "hubbatch", hubEnv...), startProc(t, "hubbatch", hubEnv...)}
	gws := []*proc{startProc(t, "credit", gwEnv(0)...), startProc(t, "credit", gwEnv(1)...)}
	acked := map[string]string{} // "session seq" -> "worker in out rejected"
	collect := func(lines []string) {
		for _, line := range lines {
			f := strings.Fields(line)
			if len(f) == 7 && f[0] == "ok" {
				acked[f[1]+" "+f[2]] = strings.Join(f[3:], " ")
			}
		}
	}
	rng := rand.New(rand.NewPCG(13, 13))
	kills := map[string]int{}
	deadline := time.Now().Add(dur)
	for time.Now().Before(deadline) {
		time.Sleep(time.Duration(30+rng.IntN(200)) * time.Millisecond)
		i := rng.IntN(4)
		if i < 2 {
			collect(hubs[i].killNow(t))
			kills["hub"]++
			hubs[i] = startProc(t, "hubbatch", hubEnv...)
			continue
		}
		g := gws[i-2]
		inside := rng.IntN(3) != 0
		if inside { // wait for it to be inside a transaction
			timeout := time.After(2 * time.Second)
		wait:
			for {
				select {
				case line := <-g.seen:
					if line == "precommit" {
						break wait
					}
				case <-timeout:
					inside = false
					break wait
				}
			}
		}
		g.killNow(t)
		if inside {
			kills["gateway in a transaction"]++
		} else {
			kills["gateway"]++
		}
		gws[i-2] = startProc(t, "credit", gwEnv(i-2)...)
	}
	for _, h := range hubs {
		collect(h.killNow(t))
	}
	for _, g := range gws {
		g.killNow(t)
	}
	final := startProc(t, "credit", "KVASIR_LEDGER_URL="+endpoints[0], "KVASIR_WALLETS="+dsn, "KVASIR_CREDIT_BATCH=1000")
	<-final.done
	if err := final.cmd.Wait(); err != nil && !strings.Contains(err.Error(), "Wait was already called") {
		t.Logf("final gateway: %v", err)
	}
	if last := final.lines[len(final.lines)-1]; last != "done" {
		t.Fatalf("final crediting run ended with %q", last)
	}
	// Every row, page by page: a fast run appends more than one Since
	// returns.
	var es []ledger.Entry
	for after := int64(0); ; {
		page, err := l.Since(after, ledger.MaxLimit)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		es = append(es, page...)
		after = page[len(page)-1].ID
	}
	got := map[string]string{}
	for _, e := range es {
		k := e.SessionID + " " + strconv.FormatUint(e.Seq, 10)
		if _, dup := got[k]; dup {
			t.Errorf("row %s twice", k)
		}
		got[k] = fmt.Sprintf("%s %d %d %d", e.WorkerID, e.BytesIn, e.BytesOut, e.RejectedBytes)
	}
	for k, v := range acked {
		if got[k] != v {
			t.Errorf("acknowledged row %s = %q, ledger has %q", k, v, got[k])
		}
	}
	if len(acked) < 100 || kills["gateway in a transaction"] == 0 || kills["hub"] == 0 {
		t.Fatalf("too little happened: %d acknowledged rows, kills %v", len(acked), kills)
	}
	t.Logf("kills %v; %d rows in the ledger, %d acknowledged before a kill", kills, len(es), len(acked))
	checkCreditedExactly(t, l, dsn)
}
