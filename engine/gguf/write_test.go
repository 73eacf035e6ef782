package gguf

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestCheckOutPath: a missing path or a regular file may be written; a
// folder, a symbolic link, a FIFO and a character device (/dev/null, only
// looked at) are refused with ErrOutPath.
func TestCheckOutPath(t *testing.T) {
	dir := t.TempDir()
	file, link, fifo := filepath.Join(dir, "f.gguf"), filepath.Join(dir, "l"), filepath.Join(dir, "p")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, ok := range []string{filepath.Join(dir, "new.gguf"), file} {
		if err := CheckOutPath(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, bad := range []string{dir, link, fifo, "/dev/null"} {
		if err := CheckOutPath(bad); !errors.Is(err, ErrOutPath) {
			t.Errorf("%s: %v, want ErrOutPath", bad, err)
		}
	}
	// WriteFile refuses too, and leaves the FIFO a FIFO.
	if err := NewWriter().WriteFile(fifo); !errors.Is(err, ErrOutPath) {
		t.Errorf("WriteFile(fifo): %v", err)
	}
	if st, err := os.Lstat(fifo); err != nil || st.Mode().Type() != os.ModeNamedPipe {
		t.Fatalf("fifo now %v, %v", st.Mode(), err)
	}
}
