package config

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type vals struct {
	listen string
	settle time.Duration
	n      int
	rate   float64
	public bool
	layers string
	mode   string
}

func newFS(v *vals) *flag.FlagSet {
	fs := flag.NewFlagSet("hub", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&v.listen, "listen", "127.0.0.1:7001", "address")
	fs.DurationVar(&v.settle, "settle", 30*time.Second, "settle delay")
	fs.IntVar(&v.n, "settle-results", 64, "results")
	fs.Float64Var(&v.rate, "rate", 1, "rate")
	fs.BoolVar(&v.public, "allow-public", false, "public")
	fs.StringVar(&v.layers, "layers", "", "layers")
	fs.Func("verify", "mode", func(s string) error {
		if s != "spot" && s != "quorum" {
			return errors.New("bad mode")
		}
		v.mode = s
		return nil
	})
	return fs
}

func write(t *testing.T, body string) string {
	p := filepath.Join(t.TempDir(), "net.toml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Keys of the role's table set flags; the command line overrides them.
func TestParseTableAndOverride(t *testing.T) {
	p := write(t, `
[hub]
listen = "10.0.0.2:7001"
settle = "5s"
settle-results = 3
rate = 0.5
allow-public = true
layers = [0, 1]
verify = "quorum"

[gateway]
listen = ":443"
`)
	var v vals
	if err := Parse(newFS(&v), "hub", []string{"--config", p, "--settle-results", "9"}, io.Discard); err != nil {
		t.Fatal(err)
	}
	want := vals{listen: "10.0.0.2:7001", settle: 5 * time.Second, n: 9, rate: 0.5, public: true, layers: "0,1", mode: "quorum"}
	if v != want {
		t.Fatalf("got %+v, want %+v", v, want)
	}
}

// A file with only top-level keys is the role's own file; a file with
// other tables but not the role's sets nothing.
func TestTopLevelAndMissingTable(t *testing.T) {
	var v vals
	if err := Parse(newFS(&v), "hub", []string{"--config", write(t, "listen = \"1.2.3.4:1\"\n")}, io.Discard); err != nil || v.listen != "1.2.3.4:1" {
		t.Fatalf("top-level: %v %+v", err, v)
	}
	v = vals{}
	if err := Parse(newFS(&v), "hub", []string{"--config", write(t, "[gateway]\nlisten = \":443\"\n")}, io.Discard); err != nil || v.listen != "127.0.0.1:7001" {
		t.Fatalf("other table: %v %+v", err, v)
	}
}

// Unknown keys and refused values are errors naming file, table and key.
func TestErrors(t *testing.T) {
	var v vals
	p := write(t, "[hub]\nlisen = \"x\"\n")
	err := Parse(newFS(&v), "hub", []string{"--config", p}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "lisen") {
		t.Fatalf("unknown key: %v", err)
	}
	err = Parse(newFS(&v), "hub", []string{"--config", write(t, "[hub]\nsettle = \"soon\"\n")}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "settle") || !strings.Contains(err.Error(), `want a duration with its unit, as a string: "30s"`) {
		t.Fatalf("bad duration: %v", err)
	}
	err = Parse(newFS(&v), "hub", []string{"--config", write(t, "[hub]\nlisten = {a = 1}\n")}, io.Discard)
	if err == nil {
		t.Fatal("a table as a flag value was accepted")
	}
	// A mistyped table, or a key outside the tables of a file that has
	// tables, is an error for every role reading the file (the gateway
	// fell back to its defaults, no crediting, without a word).
	p = write(t, "[hub]\nlisten = \"1.2.3.4:1\"\n[gateways]\nwallets = \"w.db\"\n")
	err = Parse(newFS(&v), "hub", []string{"--config", p}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "unknown table [gateways]") {
		t.Fatalf("unknown table: %v", err)
	}
	err = Parse(newFS(&v), "hub", []string{"--config", write(t, "verify = \"quorum\"\n[hub]\nlisten = \"1.2.3.4:1\"\n")}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `key "verify" is outside every table`) {
		t.Fatalf("loose key beside tables: %v", err)
	}
}

// --print-config prints TOML that, applied again, gives the same settings.
func TestPrintRoundTrip(t *testing.T) {
	var v vals
	p := write(t, "[hub]\nlisten = \"10.0.0.2:7001\"\nsettle = \"1m30s\"\nrate = 2.5\nallow-public = true\nlayers = \"3,4\"\n")
	var out bytes.Buffer
	err := Parse(newFS(&v), "hub", []string{"--config", p, "--print-config", "--settle-results", "7"}, &out)
	if !errors.Is(err, ErrPrinted) {
		t.Fatalf("err %v", err)
	}
	if !strings.Contains(out.String(), "[hub]\n") || !strings.Contains(out.String(), `settle = "1m30s"`) {
		t.Fatalf("printed:\n%s", out.String())
	}
	var w vals
	if err := Parse(newFS(&w), "hub", []string{"--config", write(t, out.String())}, io.Discard); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if w != v {
		t.Fatalf("round trip: %+v != %+v", w, v)
	}
}

// --print-config never shows a secret: --api-key's value and the password
// of a ledger URL or key=value connection string are left out, the rest
// of each value kept.
func TestPrintRedactsSecrets(t *testing.T) {
	for _, tc := range []struct{ ledger, want string }{
		{"postgres://kvasir:s3cretpw@db.lan/kvasir", `ledger = "postgres://kvasir:xxxxx@db.lan/kvasir"`},
		{"host=db.lan user=kvasir password=s3cretpw dbname=k", `ledger = "host=db.lan user=kvasir password=xxxxx dbname=k"`},
		{"postgres://kvasir@db.lan/kvasir", `ledger = "postgres://kvasir@db.lan/kvasir"`},
		// The password as a query parameter, which libpq and pgx read too.
		{"postgres://h/db?sslmode=disable&password=s3cretpw", `ledger = "postgres://h/db?password=xxxxx&sslmode=disable"`},
		{"postgres://u:s3cretpw@h/db?PassWord=s3cretpw", `ledger = "postgres://u:xxxxx@h/db?PassWord=xxxxx"`},
		// Quoted key=value passwords, spaces and escapes inside.
		{`host=h password='s3cretpw 5' user=u`, `ledger = "host=h password=xxxxx user=u"`},
		{`host=h password = 's3cretpw\' x' dbname=d`, `ledger = "host=h password = xxxxx dbname=d"`},
		{"password=s3cretpw", `ledger = "password=xxxxx"`},
		{"host=h mypassword=notakey", `ledger = "host=h mypassword=notakey"`},
		{"hub-ledger.sqlite", `ledger = "hub-ledger.sqlite"`},
	} {
		fs := flag.NewFlagSet("hub", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		key := fs.String("api-key", "", "bearer key")
		fs.String("ledger", "", "ledger")
		var out bytes.Buffer
		err := Parse(fs, "hub", []string{"--api-key", "s3cretpw", "--ledger", tc.ledger, "--print-config"}, &out)
		if !errors.Is(err, ErrPrinted) || *key != "s3cretpw" {
			t.Fatalf("err %v, key %q", err, *key)
		}
		if strings.Contains(out.String(), "s3cretpw") || !strings.Contains(out.String(), tc.want+"\n") ||
			!strings.Contains(out.String(), "# api-key = (set; a secret, not printed)\n# ... used as a config, this file leaves api-key unset") {
			t.Fatalf("printed:\n%s", out.String())
		}
	}
}

// A value of the wrong TOML kind for a typed flag is refused with the key
// and what it wants, rather than converted (allow-public = 1 used to mean
// true); the right kinds, and lists for text flags, still go through.
func TestValueKinds(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"allow-public = 1", "want true or false"},
		{`allow-public = "yes"`, "want true or false"},
		{`settle-results = "64"`, "want a whole number"},
		{"settle-results = 6.5", "want a whole number"},
		{`rate = "2.5"`, "want a number"},
		{"settle = 30", "want a duration"},
		{"allow-public = [true]", "want true or false"},
		{"settle-results = [1, 2]", "want a whole number"},
		{"listen = true", "want text"},
		{"listen = 1.5", "want text"},
	} {
		var v vals
		err := Parse(newFS(&v), "hub", []string{"--config", write(t, "[hub]\n"+tc.body+"\n")}, io.Discard)
		key := strings.Fields(tc.body)[0]
		if err == nil || !strings.Contains(err.Error(), "[hub] "+key) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want one naming %s and %q", tc.body, err, key, tc.want)
		}
	}
	var v vals
	body := "[hub]\nallow-public = true\nsettle-results = 7\nrate = 3\nsettle = \"2s\"\nlayers = [0, 1]\nverify = \"quorum\"\n"
	if err := Parse(newFS(&v), "hub", []string{"--config", write(t, body)}, io.Discard); err != nil {
		t.Fatal(err)
	}
	want := vals{listen: "127.0.0.1:7001", settle: 2 * time.Second, n: 7, rate: 3, public: true, layers: "0,1", mode: "quorum"}
	if v != want {
		t.Fatalf("got %+v, want %+v", v, want)
	}
}
