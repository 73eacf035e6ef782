package vulkan

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSPIRVUpToDate recompiles the shaders with gen.sh (glslc) into a
// temporary folder and checks that the committed spv/ files are its
// output. It skips without glslc, or with a glslc version other than the
// one that made spv/ (spv/GLSLC_VERSION): other versions emit other bytes.
func TestSPIRVUpToDate(t *testing.T) {
	glslc, err := exec.LookPath("glslc")
	if err != nil {
		t.Skip("glslc not installed (Debian package glslc)")
	}
	v, err := exec.Command(glslc, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	have := strings.SplitN(string(v), "\n", 2)[0]
	want, err := os.ReadFile("spv/GLSLC_VERSION")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(want)) != strings.TrimSpace(have) {
		t.Skipf("glslc is %q, spv/ was made by %q", have, strings.TrimSpace(string(want)))
	}
	dir := t.TempDir()
	if out, err := exec.Command("sh", "gen.sh", dir).CombinedOutput(); err != nil {
		t.Fatalf("gen.sh: %v\n%s", err, out)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	if len(files) < 12 {
		t.Fatalf("gen.sh wrote %d files", len(files))
	}
	for _, f := range files {
		got, _ := os.ReadFile(f)
		committed, err := os.ReadFile(filepath.Join("spv", filepath.Base(f)))
		if err != nil {
			t.Errorf("%s: not committed: %v", filepath.Base(f), err)
			continue
		}
		if !bytes.Equal(got, committed) {
			t.Errorf("spv/%s differs from gen.sh's output: run go generate ./engine/vulkan/", filepath.Base(f))
		}
	}
}
