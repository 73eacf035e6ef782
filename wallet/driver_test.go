package wallet

import (
	"bufio"
	"crypto/ed25519"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/wallet/dbfile"
	"github.com/kvasir-ai/kvasir/wallet/walletapi"
)

// updateGolden rewrites this build's driver's golden wallet
// (testdata/v1-<driver>.db): go test ./wallet -run TestDriversShareFileFormat
// -update-golden, once with cgo and once with CGO_ENABLED=0.
var updateGolden = flag.Bool("update-golden", false, "rewrite testdata/v1-<driver>.db with this build's SQLite driver")

// goldenFiles are schema-1 wallets written by each driver, through Open,
// Served, AddStatements and RecordPayout with a fixed clock (goldenWallet).
var goldenFiles = map[string]string{
	"sqlite3": "testdata/v1-sqlite3.db", // github.com/mattn/go-sqlite3 (cgo)
	"sqlite":  "testdata/v1-sqlite.db",  // modernc.org/sqlite (pure Go)
}

var goldenClock = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// goldenWallet writes the content of the golden files at path.
func goldenWallet(t *testing.T, path string) {
	t.Helper()
	id := testID(7)
	w, err := Open(path, id, Options{Now: func() time.Time { return goldenClock }})
	if err != nil {
		t.Fatal(err)
	}
	w.Served("golden-1", 500_000, 200_000)
	w.Served("golden-2", 400_000, 177_952)
	gw := gwKey().Public().(ed25519.PublicKey)
	if _, err := w.AddStatements(gw, statements(t, id, 7, 1, 0, 1_000_000, 277_952)); err != nil {
		t.Fatal(err)
	}
	if err := w.RecordPayout(1_000_000, "golden-payout", goldenClock); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// schemaOf returns a file's sqlite_schema rows and the header facts that
// define the format: page size, text encoding, user_version, application_id.
func schemaOf(t *testing.T, path string) string {
	t.Helper()
	dsn, err := dbfile.ReadOnlyDSN(path)
	if err != nil {
		t.Fatal(err)
	}
	db, err := dbfile.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var b strings.Builder
	rows, err := db.Query(`SELECT type, name, tbl_name, COALESCE(sql, '') FROM sqlite_schema ORDER BY type, name`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var typ, name, tbl, sqlText string
		if err := rows.Scan(&typ, &name, &tbl, &sqlText); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s %s %s %s\n", typ, name, tbl, sqlText)
	}
	rows.Close()
	for _, p := range []string{"page_size", "encoding", "user_version", "application_id", "auto_vacuum"} {
		var v string
		if err := db.QueryRow(`PRAGMA ` + p).Scan(&v); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s=%s\n", p, v)
	}
	return b.String()
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestDriversShareFileFormat: a wallet written by either SQLite driver
// (mattn/go-sqlite3 with cgo, modernc.org/sqlite without) is opened,
// checked, read and extended by this build's driver with the same results,
// and a wallet this build creates has exactly the golden files' schema,
// page size, encoding, user_version and application id (header byte 68
// "KVWW", WAL mode bytes 18-19 = 2).
func TestDriversShareFileFormat(t *testing.T) {
	t.Logf("this build's SQLite driver: %s", dbfile.DriverDescription)
	dir := t.TempDir()
	fresh := filepath.Join(dir, "fresh.db")
	goldenWallet(t, fresh)
	if *updateGolden {
		copyFile(t, fresh, goldenFiles[dbfile.Driver])
		t.Logf("wrote %s", goldenFiles[dbfile.Driver])
	}
	hdr, err := os.ReadFile(fresh)
	if err != nil {
		t.Fatal(err)
	}
	if string(hdr[:16]) != "SQLite format 3\x00" || string(hdr[68:72]) != "KVWW" || hdr[18] != 2 || hdr[19] != 2 || hdr[63] != SchemaVersion {
		t.Errorf("header: magic %q, app id %q, read/write versions %d/%d, user_version %d", hdr[:16], hdr[68:72], hdr[18], hdr[19], hdr[63])
	}
	want := schemaOf(t, fresh)
	for driver, golden := range goldenFiles {
		t.Run(driver, func(t *testing.T) {
			if _, err := os.Stat(golden); err != nil {
				t.Fatalf("%v (write it with -update-golden under the %s driver)", err, driver)
			}
			p := filepath.Join(t.TempDir(), "w.db")
			copyFile(t, golden, p)
			if got := schemaOf(t, p); got != want {
				t.Fatalf("schema of the %s file:\n%s\nthis build's (%s):\n%s", driver, got, dbfile.Driver, want)
			}
			if info, err := Check(p); err != nil || info.State != dbfile.Current {
				t.Fatalf("Check: %+v %v", info, err)
			}
			id := testID(7)
			w, err := Open(p, id, Options{})
			if err != nil {
				t.Fatal(err)
			}
			s, err := w.Summary()
			if err != nil {
				t.Fatal(err)
			}
			if s.BytesServed != 1_277_952 || s.CreditedBytes != 1_277_952 || s.CreditedNKVR != 8_945_664 || s.PaidNKVR != 1_000_000 ||
				s.PendingNKVR != 7_945_664 || s.Statements != 2 || s.Address != id.Address || len(s.History) != 5 {
				t.Fatalf("summary of the %s file: %+v", driver, s)
			}
			// This driver extends the other's file: a third statement and more bytes.
			w.Served("golden-3", 10, 20)
			gw := gwKey().Public().(ed25519.PublicKey)
			if _, err := w.AddStatements(gw, statements(t, id, 7, 3, 1_277_952, 30)); err != nil {
				t.Fatal(err)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			w = openW(t, p, id)
			if s, err := w.Summary(); err != nil || s.BytesServed != 1_277_982 || s.CreditedBytes != 1_277_982 || s.Statements != 3 {
				t.Fatalf("after extending: %+v %v", s, err)
			}
			if _, err := Open(p, testID(8), Options{}); !errors.Is(err, ErrWrongIdentity) {
				t.Errorf("other identity: %v", err)
			}
		})
	}
}

// execWrapper is the environment variable naming a program that runs this
// test binary's children: under user-mode emulation (scripts/test.sh sets
// it to qemu-aarch64-static for the linux/arm64 run) a foreign binary
// cannot be executed directly.
const execWrapper = "KVASIR_TEST_EXEC_WRAPPER"

// selfCommand returns a command running this test binary with args,
// through $KVASIR_TEST_EXEC_WRAPPER when set.
func selfCommand(args ...string) *exec.Cmd {
	if w := os.Getenv(execWrapper); w != "" {
		return exec.Command(w, append([]string{os.Args[0]}, args...)...)
	}
	return exec.Command(os.Args[0], args...)
}

const crashChild = "KVASIR_WALLET_CRASH_CHILD" // wallet path for the child of TestCrashKeepsFlushedCounts

// TestCrashKeepsFlushedCounts SIGKILLs a process that is counting served
// bytes into a wallet (with a flush every 50 exchanges, as the worker's
// OnServed does about every second) and statements arriving in between.
// The wallet reopens, passes quick_check, and holds at least every count
// and statement the child reported stored.
func TestCrashKeepsFlushedCounts(t *testing.T) {
	if p := os.Getenv(crashChild); p != "" {
		crashChildMain(p)
		return
	}
	path := filepath.Join(t.TempDir(), "wallet.db")
	cmd := selfCommand("-test.run=^TestCrashKeepsFlushedCounts$")
	cmd.Env = append(os.Environ(), crashChild+"="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	sc := bufio.NewScanner(out)
	var flushed uint64
	var stmts int
	deadline := time.Now().Add(60 * time.Second)
	for sc.Scan() {
		var f uint64
		var n int
		if _, err := fmt.Sscanf(sc.Text(), "flushed %d statements %d", &f, &n); err != nil {
			continue
		}
		flushed, stmts = f, n
		if stmts >= 20 || time.Now().After(deadline) {
			break
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, out)
	_ = cmd.Wait()
	if stmts < 20 {
		t.Fatalf("the child reported only %d statements before %v (flushed %d)", stmts, deadline, flushed)
	}
	if info, err := Check(path); err != nil || info.State != dbfile.Current {
		t.Fatalf("after the crash: %+v %v", info, err)
	}
	w := openW(t, path, testID(5))
	s, err := w.Summary()
	if err != nil {
		t.Fatal(err)
	}
	// The child went on after its last line read here: that line is a
	// lower bound.
	if s.BytesServed < flushed || s.Statements < uint64(stmts) {
		t.Fatalf("after the crash: %d bytes and %d statements, the child had flushed %d bytes and stored %d statements",
			s.BytesServed, s.Statements, flushed, stmts)
	}
	var qc string
	if err := w.db.QueryRow(`PRAGMA quick_check`).Scan(&qc); err != nil || qc != "ok" {
		t.Fatalf("quick_check %q %v", qc, err)
	}
	t.Logf("killed after %d bytes flushed and %d statements; reopened with %d bytes, %d statements (%s)",
		flushed, stmts, s.BytesServed, s.Statements, dbfile.DriverDescription)
}

// crashChildMain counts exchanges into the wallet at path until killed,
// printing after every flush what is on disk.
func crashChildMain(path string) {
	id := testID(5)
	w, err := Open(path, id, Options{})
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(1)
	}
	gw := gwKey()
	var counted, cum uint64 // bytes counted (all flushed at each line), bytes credited
	for i := 1; ; i++ {
		w.Served("crash-"+strconv.Itoa(i/500), 1000, 24)
		counted += 1024
		if i%50 != 0 {
			continue
		}
		if err := w.Flush(); err != nil {
			fmt.Println("flush:", err)
			os.Exit(1)
		}
		n := i / 50
		cum += 1000
		sg, err := signStatement(gw, id, uint64(n), cum, 1000)
		if err != nil {
			fmt.Println("sign:", err)
			os.Exit(1)
		}
		if _, err := w.AddStatements(gw.Public().(ed25519.PublicKey), sg); err != nil {
			fmt.Println("statement:", err)
			os.Exit(1)
		}
		fmt.Printf("flushed %d statements %d\n", counted, n)
	}
}

// signStatement signs statement n for id: delta bytes at 7 nKVR/byte,
// cumBytes in all.
func signStatement(gw ed25519.PrivateKey, id Identity, n, cumBytes, delta uint64) ([]walletapi.Signed, error) {
	st := walletapi.Statement{Worker: id.WorkerID, N: n, LedgerAfter: int64(n), LedgerUpTo: int64(n) + 1, Bytes: delta,
		RateNKVRPerByte: 7, NKVR: 7 * delta, CumulativeBytes: cumBytes, CumulativeNKVR: 7 * cumBytes, TimeUnixMilli: 1_700_000_000_000 + int64(n)}
	sg, err := walletapi.Sign(gw, st)
	return []walletapi.Signed{sg}, err
}
