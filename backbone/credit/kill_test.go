//go:build unix

package credit

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/ledger"
	"github.com/kvasir-ai/kvasir/wallet/dbfile"
)

// The helper processes: the test binary re-executed with KVASIR_CREDIT_HELPER.
const helperEnv = "KVASIR_CREDIT_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		os.Exit(m.Run())
	case "credit":
		os.Exit(helperCredit())
	case "append":
		os.Exit(helperAppend())
	case "hubbatch":
		os.Exit(helperHubBatch())
	default:
		fmt.Fprintln(os.Stderr, "unknown helper", os.Getenv(helperEnv))
		os.Exit(2)
	}
}

const helperRate = 7

// helperCredit is a gateway's crediting loop reading the hub's ledger over
// HTTP, two rows per transaction, announcing "precommit" inside each
// transaction (then pausing 2 ms so a kill lands inside it) and
// "commit <cursor>" after it.
func helperCredit() int {
	src := &ledger.Client{BaseURL: os.Getenv("KVASIR_LEDGER_URL"), Sign: func(r *http.Request) error {
		r.Header.Set("X-Test-Auth", "yes")
		return nil
	}}
	batch := 2
	if b, err := strconv.Atoi(os.Getenv("KVASIR_CREDIT_BATCH")); err == nil {
		batch = b
	}
	s, err := Open(Config{Path: os.Getenv("KVASIR_WALLETS"), Source: src, RateNKVRPerByte: helperRate, Batch: batch})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	s.beforeCommit = func() error {
		fmt.Println("precommit")
		time.Sleep(2 * time.Millisecond)
		return nil
	}
	loop := os.Getenv("KVASIR_CREDIT_LOOP") != "" // keep crediting (concurrent gateways), tolerating conflicts
	for {
		r, err := s.CreditBatch(context.Background())
		if loop && errors.Is(err, ErrConflict) {
			fmt.Println("conflict")
			continue
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if r.Rows == 0 {
			if loop {
				time.Sleep(2 * time.Millisecond)
				continue
			}
			fmt.Println("done")
			return 0
		}
		fmt.Println("commit", r.Cursor)
	}
}

// helperAppend is a hub appending random entries as fast as it can,
// printing "ok id worker in out rejected" after each durable append.
func helperAppend() int {
	l, err := ledger.Open(os.Getenv("KVASIR_LEDGER"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	rng := rand.New(rand.NewPCG(uint64(os.Getpid()), uint64(time.Now().UnixNano())))
	for {
		e := ledger.Entry{SessionID: fmt.Sprint("p", os.Getpid()), WorkerID: workerID(rng.IntN(4)),
			BytesIn: uint64(rng.IntN(100000)), BytesOut: uint64(rng.IntN(100000)), RejectedBytes: uint64(rng.IntN(2) * rng.IntN(1000))}
		id, err := l.Add(context.Background(), e)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Printf("ok %d %s %d %d %d\n", id, e.WorkerID, e.BytesIn, e.BytesOut, e.RejectedBytes)
	}
}

// startHelper starts the test binary in helper mode; lines of its stdout
// arrive on the returned channel, which closes when the pipe does.
func startHelper(t *testing.T, mode string, env ...string) (*exec.Cmd, <-chan string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{helperEnv + "=" + mode}, env...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1<<16)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	return cmd, lines
}

func kill(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
}

func appendRandom(t *testing.T, l *ledger.Ledger, rng *rand.Rand, n int) {
	t.Helper()
	for range n {
		e := ledger.Entry{SessionID: fmt.Sprint("s", rng.IntN(20)), WorkerID: workerID(rng.IntN(5)),
			BytesIn: uint64(rng.IntN(1 << 20)), BytesOut: uint64(rng.IntN(1 << 12)), RejectedBytes: uint64(rng.IntN(3) / 2 * rng.IntN(777))}
		if err := l.Append(e); err != nil {
			t.Fatal(err)
		}
	}
}

// checkCreditedExactly opens the wallets file and compares every worker's
// credit with the ledger's totals x rate, and checks the statement chains.
func checkCreditedExactly(t *testing.T, l *ledger.Ledger, wallets string) {
	t.Helper()
	s, err := Open(Config{Path: wallets, Source: l, RateNKVRPerByte: helperRate})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tot, err := l.Totals()
	if err != nil {
		t.Fatal(err)
	}
	ws, sum := creditedTotal(t, s)
	var want uint64
	for _, wt := range tot {
		want += helperRate * wt.Bytes
		if w := ws[wt.ID]; w.Bytes != wt.Bytes || w.NKVR != helperRate*wt.Bytes || w.RejectedBytes != wt.RejectedBytes {
			t.Errorf("worker %s: credited %+v, ledger %+v", wt.ID[:8], w, wt)
		}
	}
	if sum != want {
		t.Errorf("credited %d nKVR in all, want %d", sum, want)
	}
	checkStatements(t, s)
}

// TestKillCreditingProcess SIGKILLs a real crediting process again and
// again, often inside its transaction, while the hub keeps appending; then
// lets it finish and checks every byte was credited exactly once.
func TestKillCreditingProcess(t *testing.T) { forBackends(t, killCreditingProcess) }

func killCreditingProcess(t *testing.T, b backend) {
	rounds := 12
	if testing.Short() {
		rounds = 4
	}
	lpath, wallets := b.paths(t)
	l, err := ledger.Open(lpath)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	rng := rand.New(rand.NewPCG(7, 7))
	appendRandom(t, l, rng, 120)
	srv := httptest.NewServer(ledger.Handler(l, func(r *http.Request) bool { return r.Header.Get("X-Test-Auth") == "yes" }))
	defer srv.Close()
	env := []string{"KVASIR_LEDGER_URL=" + srv.URL, "KVASIR_WALLETS=" + wallets}
	inTx, afterCommit := 0, 0
	for round := range rounds {
		cmd, lines := startHelper(t, "credit", env...)
		// Kill right after the k-th "precommit" (inside the transaction) or
		// right after the k-th "commit" line.
		k, inside := 1+rng.IntN(6), rng.IntN(3) != 0
		want := "commit"
		if inside {
			want = "precommit"
		}
		seen := 0
		killed := false
		for line := range lines {
			if line == "done" {
				break
			}
			if strings.HasPrefix(line, want) {
				if seen++; seen == k {
					kill(t, cmd)
					killed = true
					if inside {
						inTx++
					} else {
						afterCommit++
					}
					break
				}
			}
		}
		if !killed {
			_ = cmd.Wait()
		}
		appendRandom(t, l, rng, rng.IntN(15)) // the hub keeps going
		_ = round
	}
	cmd, lines := startHelper(t, "credit", env...)
	last := ""
	for line := range lines {
		last = line
	}
	if err := cmd.Wait(); err != nil || last != "done" {
		t.Fatalf("final crediting run: %v, last line %q", err, last)
	}
	if inTx == 0 {
		t.Fatal("no kill landed inside a transaction")
	}
	t.Logf("%d kills inside a transaction, %d right after a commit; %d ledger rows", inTx, afterCommit, mustLastID(t, l))
	checkCreditedExactly(t, l, wallets)
}

func mustLastID(t *testing.T, l *ledger.Ledger) int64 {
	id, err := l.LastID()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestKillAppendingHub SIGKILLs a real appending process at random moments
// while this process credits from the same ledger file; every append the
// hub acknowledged survives unchanged, the file stays intact, and the final
// credit equals rate x the ledger's creditable bytes.
func TestKillAppendingHub(t *testing.T) { forBackends(t, killAppendingHub) }

func killAppendingHub(t *testing.T, b backend) {
	rounds := 12
	if testing.Short() {
		rounds = 4
	}
	lpath, wallets := b.paths(t)
	l, err := ledger.Open(lpath)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	s, err := Open(Config{Path: wallets, Source: l, RateNKVRPerByte: helperRate, Batch: 3})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = s.Run(ctx, 3*time.Millisecond, nil) })

	rng := rand.New(rand.NewPCG(9, 9))
	acked := map[int64]string{}
	for range rounds {
		cmd, lines := startHelper(t, "append", "KVASIR_LEDGER="+lpath)
		first := <-lines
		time.Sleep(time.Duration(rng.IntN(25)) * time.Millisecond)
		kill(t, cmd)
		for _, line := range append([]string{first}, drain(lines)...) {
			f := strings.Fields(line)
			if len(f) != 6 || f[0] != "ok" {
				continue
			}
			id, _ := strconv.ParseInt(f[1], 10, 64)
			acked[id] = strings.Join(f[2:], " ")
		}
	}
	cancel()
	wg.Wait()
	s.Close()
	if len(acked) < rounds {
		t.Fatalf("only %d acknowledged appends in %d rounds", len(acked), rounds)
	}
	es, err := l.Since(0, ledger.MaxLimit)
	if err != nil {
		t.Fatal(err)
	}
	got := map[int64]string{}
	for _, e := range es {
		got[e.ID] = fmt.Sprintf("%s %d %d %d", e.WorkerID, e.BytesIn, e.BytesOut, e.RejectedBytes)
	}
	for id, v := range acked {
		if got[id] != v {
			t.Errorf("acknowledged row %d = %q, ledger has %q", id, v, got[id])
		}
	}
	if !b.pg {
		dsn, _ := dbfile.DSN(lpath)
		db, err := dbfile.Open(dsn)
		if err != nil {
			t.Fatal(err)
		}
		var ic string
		if err := db.QueryRow(`PRAGMA integrity_check`).Scan(&ic); err != nil || ic != "ok" {
			t.Fatalf("integrity_check: %q %v", ic, err)
		}
		db.Close()
	} else if err := l.Append(ledger.Entry{SessionID: "after", WorkerID: workerID(1), BytesIn: 1}); err != nil {
		// A hub killed inside its transaction held the id lock: the server
		// released it when the connection died.
		t.Fatalf("append after the kills: %v", err)
	}
	// Finish crediting (a restarted gateway) and check exactly once.
	s, err = Open(Config{Path: wallets, Source: l, RateNKVRPerByte: helperRate})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Credit(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.Close()
	t.Logf("%d rounds, %d acknowledged appends, %d rows in the ledger", rounds, len(acked), len(es))
	checkCreditedExactly(t, l, wallets)
}

func drain(c <-chan string) []string {
	var out []string
	for s := range c {
		out = append(out, s)
	}
	return out
}
