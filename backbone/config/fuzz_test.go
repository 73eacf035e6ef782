package config

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// FuzzApply: any file contents either apply to a role's flags or give an
// error; never a panic, and a file that applied prints back (--print-config)
// without error.
func FuzzApply(f *testing.F) {
	for _, s := range []string{
		"[hub]\nlisten = \"127.0.0.1:7001\"\nsettle = \"30s\"\nsettle-results = 128\n",
		"[hub]\nsettle = 5\n", "[hub]\nunknown = 1\n", "[hub\n", "[serve]\nlisten = 1\n",
		"[hub]\nlisten = [\"a\", \"b\"]\n", "[hub]\nverbose = true\nsettle-results = -3\n", "",
	} {
		f.Add([]byte(s))
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "c.toml")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		fs := flag.NewFlagSet("hub", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		fs.String("listen", "127.0.0.1:7001", "")
		fs.Duration("settle", 30*time.Second, "")
		fs.Int("settle-results", 128, "")
		fs.Bool("verbose", false, "")
		if err := Apply(fs, path, "hub"); err != nil {
			return
		}
		if err := Print(io.Discard, fs, "hub"); err != nil {
			t.Fatalf("%q applied but does not print: %v", data, err)
		}
	})
}
