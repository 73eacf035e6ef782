package dispatch

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/engine/wire"
)

// TestSplitPairsBoundary: for widths where the RESULT or the DISPATCH is
// the binding frame, a call one pair (or row) below the limit is one
// request, one above is cut; every run fits wire.MaxMessage, is as long as
// it can be, and the runs are the call's pairs in order.
func TestSplitPairsBoundary(t *testing.T) {
	for _, tc := range []struct {
		name    string
		d, k    int
		perRow  int // slots of each row routed to this worker
		extra   int // pairs beyond the first boundary
		wantCut int // pairs in the first run
	}{
		{"result-bound d2048 k8", 2048, 8, 8, 1, maxFramePairs(2048)},
		{"result-bound d2048 k8 partial rows", 2048, 8, 3, 1, maxFramePairs(2048)},
		{"result-bound d7 k3", 7, 3, 3, 5, maxFramePairs(7)},
		{"dispatch-bound d62 k2", 62, 2, 1, 1, maxFrameRows(62, 2)},
		{"dispatch-bound d4096 k128", 4096, 128, 1, 3, maxFrameRows(4096, 128)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &Dispatcher{cfg: Config{Model: Model{D: tc.d, K: tc.k}}}
			mp, mr := maxFramePairs(tc.d), maxFrameRows(tc.d, tc.k)
			if wire.ResultSize(mp, tc.d) > wire.MaxMessage || wire.ResultSize(mp+1, tc.d) <= wire.MaxMessage ||
				wire.DispatchSize(mr, tc.d, tc.k) > wire.MaxMessage || wire.DispatchSize(mr+1, tc.d, tc.k) <= wire.MaxMessage {
				t.Fatalf("limits %d pairs, %d rows are not the boundary", mp, mr)
			}
			mk := func(n int) []pair {
				ps := make([]pair, n)
				for i := range ps {
					ps[i] = pair{int32(i / tc.perRow), int32(i % tc.perRow)}
				}
				return ps
			}
			if runs := d.splitPairs(mk(tc.wantCut)); len(runs) != 1 {
				t.Fatalf("%d pairs at the limit: %d runs", tc.wantCut, len(runs))
			}
			ps := mk(tc.wantCut + tc.extra)
			runs := d.splitPairs(ps)
			if len(runs) != 2 || len(runs[0]) != tc.wantCut {
				t.Fatalf("%d pairs: runs of %d", len(ps), lens(runs))
			}
			i := 0
			for ri, run := range runs {
				rows := 0
				for j, p := range run {
					if p != ps[i] {
						t.Fatalf("run %d pair %d is %v, want %v", ri, j, p, ps[i])
					}
					if j == 0 || run[j-1].r != p.r {
						rows++
					}
					i++
				}
				if wire.ResultSize(len(run), tc.d) > wire.MaxMessage || wire.DispatchSize(rows, tc.d, tc.k) > wire.MaxMessage {
					t.Fatalf("run %d: %d pairs, %d rows exceed the frame limit", ri, len(run), rows)
				}
				if ri == 0 && len(run) != mp && !(rows == mr && ps[i].r != run[len(run)-1].r) {
					t.Fatalf("run 0 could take the next pair: %d pairs, %d rows", len(run), rows)
				}
			}
			if i != len(ps) {
				t.Fatalf("runs hold %d of %d pairs", i, len(ps))
			}
		})
	}
}

func lens(runs [][]pair) []int {
	var out []int
	for _, r := range runs {
		out = append(out, len(r))
	}
	return out
}

// TestBans: bans persist in the file across opens, expire, extend but
// never shorten, and a damaged file is refused rather than ignored.
func TestBans(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bans.json")
	b, err := OpenBans(path)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if err := b.Add("aa", now, now.Add(time.Hour), "lied"); err != nil {
		t.Fatal(err)
	}
	if err := b.Add("bb", now.Add(-2*time.Hour), now.Add(-time.Hour), "old"); err != nil {
		t.Fatal(err)
	}
	if err := b.Add("aa", now, now.Add(time.Minute), "shorter"); err != nil { // kept: the later end
		t.Fatal(err)
	}
	re, err := OpenBans(path)
	if err != nil {
		t.Fatal(err)
	}
	if x, ok := re.Banned("aa", now); !ok || x.Reason != "lied" || !x.Until.Equal(now.Add(time.Hour)) {
		t.Fatalf("aa after reopen: %+v %v", x, ok)
	}
	if _, ok := re.Banned("bb", now); ok {
		t.Fatal("expired ban in force")
	}
	if _, ok := re.Banned("aa", now.Add(2*time.Hour)); ok {
		t.Fatal("ban in force after its end")
	}
	raw, _ := os.ReadFile(path)
	if strings.Contains(string(raw), `"bb"`) || len(re.List(now)) != 1 {
		t.Fatalf("expired ban kept in the file: %s", raw)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm()&0o077 != 0 {
		t.Fatalf("ban file mode %v", fi.Mode())
	}
	for _, bad := range []string{"not json", `{"v":2,"bans":[]}`, `{"v":1,"bans":[{"worker":""}]}`} {
		if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := OpenBans(path); !errors.Is(err, ErrBansFile) {
			t.Fatalf("%q: %v", bad, err)
		}
	}
	mem, err := OpenBans("")
	if err != nil || mem.Add("cc", now, now.Add(time.Hour), "x") != nil {
		t.Fatal(err)
	}
	if _, ok := mem.Banned("cc", now); !ok {
		t.Fatal("memory ban lost")
	}
}
