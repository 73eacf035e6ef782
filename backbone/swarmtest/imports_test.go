package swarmtest

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestImportArrows walks the module's Go files (not _test.go ones) and
// checks the import arrows point down: swarmtest is imported by tests
// only; engine/ and wallet/ import neither backbone/ nor app/; app/,
// mobile/ and the root command do not import backbone/.
func TestImportArrows(t *testing.T) {
	const mod = "github.com/kvasir-ai/kvasir/"
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (strings.HasPrefix(n, ".") || n == "testdata" || n == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		files++
		var banned []string
		switch top, _, _ := strings.Cut(rel, "/"); {
		case top == "engine" || top == "wallet":
			banned = []string{"backbone/", "app/"}
		case top == "app" || top == "mobile" || !strings.Contains(rel, "/"):
			banned = []string{"backbone/"}
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			rest, ok := strings.CutPrefix(p, mod)
			if !ok {
				continue
			}
			if rest == "backbone/swarmtest" && !strings.HasPrefix(rel, "scripts/") { // tests, and the measurement tools under scripts/
				t.Errorf("%s imports the test harness %s (tests only)", rel, p)
			}
			for _, b := range banned {
				if strings.HasPrefix(rest, b) {
					t.Errorf("%s imports %s: an upward arrow", rel, p)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 50 {
		t.Fatalf("read only %d files under %s", files, root)
	}
}
