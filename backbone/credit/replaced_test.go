package credit

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/ledger"
	"github.com/kvasir-ai/kvasir/backbone/pgstore/pgtest"
)

// A ledger that is not the one the wallets were credited from, but holds a
// row at the cursor's id (an older backup restored and grown past the
// cursor again, another hub's ledger): crediting from it would skip its
// rows up to the cursor for good. The print of the cursor's row stored
// with the cursor tells it apart: Credit and PingLedger fail with
// ErrLedgerBehind, the cursor and the wallets stay as they were. The
// ledger the wallets came from still credits.
func TestLedgerReplacedPastCursor(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		lp, wp := b.paths(t)
		l, err := ledger.Open(lp)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		for i := range 5 {
			if err := l.Append(ledger.Entry{SessionID: "s1", WorkerID: workerID(1), BytesIn: uint64(100 + i), Time: time.Now()}); err != nil {
				t.Fatal(err)
			}
		}
		s, err := Open(Config{Path: wp, Source: l, RateNKVRPerByte: 7})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Credit(ctx); err != nil {
			t.Fatal(err)
		}
		s.Close()

		otherPath := lp + ".other"
		if b.pg {
			otherPath = pgtest.DSN(t)
		}
		other, err := ledger.Open(otherPath)
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		for range 8 { // past the cursor (5)
			if err := other.Append(ledger.Entry{SessionID: "s2", WorkerID: workerID(2), BytesIn: 1000, Time: time.Now()}); err != nil {
				t.Fatal(err)
			}
		}
		s2, err := Open(Config{Path: wp, Source: other, RateNKVRPerByte: 7})
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		_, err = s2.Credit(ctx)
		if !errors.Is(err, ErrLedgerBehind) || !strings.Contains(err.Error(), "is not the row credited") {
			t.Fatalf("Credit from a replaced ledger = %v, want ErrLedgerBehind (not the row credited)", err)
		}
		if err := s2.PingLedger(ctx); !errors.Is(err, ErrLedgerBehind) {
			t.Fatalf("PingLedger = %v, want ErrLedgerBehind", err)
		}
		ws, err := s2.Wallets()
		if err != nil {
			t.Fatal(err)
		}
		if c, _ := s2.Cursor(); c != 5 || len(ws) != 1 || ws[0].Worker != workerID(1) {
			t.Fatalf("cursor %d, wallets %+v: the replaced ledger's rows were credited", c, ws)
		}
		s2.Close()

		// Its own ledger, grown meanwhile, credits on.
		if err := l.Append(ledger.Entry{SessionID: "s3", WorkerID: workerID(1), BytesIn: 50, Time: time.Now()}); err != nil {
			t.Fatal(err)
		}
		s3, err := Open(Config{Path: wp, Source: l, RateNKVRPerByte: 7})
		if err != nil {
			t.Fatal(err)
		}
		defer s3.Close()
		if r, err := s3.Credit(ctx); err != nil || r.Cursor != 6 || r.Bytes != 50 {
			t.Fatalf("own ledger: %+v, %v", r, err)
		}
		if err := s3.PingLedger(ctx); err != nil {
			t.Fatalf("own ledger: PingLedger %v", err)
		}
	})
}

// A wallets file written before prints (no 'cursor_row') is checked for
// the cursor row's presence only, and gets its print at the next credit.
func TestCursorWithoutPrint(t *testing.T) {
	ctx := context.Background()
	l, s := openPair(t, t.TempDir(), 7)
	for i := range 3 {
		if err := l.Append(ledger.Entry{SessionID: "s1", WorkerID: workerID(1), BytesIn: uint64(10 + i), Time: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Credit(ctx); err != nil {
		t.Fatal(err)
	}
	db := s.st.(*sqliteStore).db
	if _, err := db.ExecContext(ctx, `DELETE FROM meta WHERE k = 'cursor_row'`); err != nil {
		t.Fatal(err)
	}
	if err := s.PingLedger(ctx); err != nil {
		t.Fatalf("a cursor without a print: %v", err)
	}
	if err := l.Append(ledger.Entry{SessionID: "s2", WorkerID: workerID(1), BytesIn: 7, Time: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Credit(ctx); err != nil || r.Cursor != 4 {
		t.Fatalf("credit: %+v %v", r, err)
	}
	var print []byte
	if err := db.QueryRowContext(ctx, `SELECT v FROM meta WHERE k = 'cursor_row'`).Scan(&print); errors.Is(err, sql.ErrNoRows) || len(print) != 32 {
		t.Fatalf("no print stored at the next credit: %x %v", print, err)
	}
}

// CreditError (the gateway's /readyz "crediting" check) reports a failing
// crediting pass while Run goes on, and clears after one that works.
func TestCreditError(t *testing.T) {
	dir := t.TempDir()
	l, err := ledger.Open(dir + "/ledger.db")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	src := &switchable{r: l}
	src.down.Store(true)
	s, err := Open(Config{Path: dir + "/wallets.db", Source: src, RateNKVRPerByte: 7})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Run(ctx, 10*time.Millisecond, nil)
	wait := func(what string, ok func(error) bool) {
		for deadline := time.Now().Add(5 * time.Second); !ok(s.CreditError(ctx)); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: CreditError = %v", what, s.CreditError(ctx))
			}
		}
	}
	wait("hub unreachable", func(err error) bool { return err != nil && strings.Contains(err.Error(), "hub unreachable") })
	src.down.Store(false)
	wait("hub back", func(err error) bool { return err == nil })
}

// switchable is a ledger source that fails every read while down.
type switchable struct {
	r    ledger.Reader
	down atomic.Bool
}

func (s *switchable) Read(ctx context.Context, after int64, limit int) ([]ledger.Entry, error) {
	if s.down.Load() {
		return nil, errors.New("switchable: hub unreachable")
	}
	return s.r.Read(ctx, after, limit)
}
