package dispatch

import (
	"context"
	"math/rand/v2"
	"testing"
)

// rowExperts is a batch-invariant Computer whose output depends on the
// row, the expert and the layer only: out = hidden * (expert + 1) + layer.
// It records the (n, k) of each call.
type rowExperts struct {
	d     int
	calls [][2]int
}

func (f *rowExperts) ComputeExperts(_ context.Context, layer int, hidden []float32, ids []int32, n, k int, out []float32) error {
	f.calls = append(f.calls, [2]int{n, k})
	for r := range n {
		for s := range k {
			e := ids[r*k+s]
			for i := range f.d {
				out[(r*k+s)*f.d+i] = hidden[r*f.d+i]*float32(e+1) + float32(layer)
			}
		}
	}
	return nil
}

// TestComputePairs: computePairs returns each pair's output in pairs'
// order (compared with the formula per pair), computing whole rows (all k
// slots, consecutive, in slot order) as rows with k ids and every other
// pair as a row of its own; sets of whole rows only, partial rows only,
// rows out of slot order and mixes of both.
func TestComputePairs(t *testing.T) {
	const D, K, N, layer = 4, 3, 6, 2
	rng := rand.New(rand.NewPCG(1, 2))
	hidden := make([]float32, N*D)
	for i := range hidden {
		hidden[i] = float32(rng.NormFloat64())
	}
	ids := make([]int32, N*K)
	for i := range ids {
		ids[i] = int32(rng.IntN(8))
	}
	all := func(rows ...int32) []pair {
		var ps []pair
		for _, r := range rows {
			for s := range int32(K) {
				ps = append(ps, pair{r, s})
			}
		}
		return ps
	}
	for _, tc := range []struct {
		name       string
		pairs      []pair
		wantWhole  int // rows computed with k ids
		wantSingle int // pairs computed as rows of their own
	}{
		{"whole rows", all(0, 2, 5), 3, 0},
		{"partial rows", []pair{{0, 0}, {0, 2}, {3, 1}}, 0, 3},
		{"slots out of order", []pair{{1, 1}, {1, 0}, {1, 2}}, 0, 3},
		{"mixed", append(append([]pair{{4, 2}}, all(1, 3)...), pair{0, 0}, pair{0, 1}), 2, 3},
		{"partial between whole", append(append(all(5), pair{2, 1}), all(0)...), 2, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &rowExperts{d: D}
			d := &Dispatcher{cfg: Config{Model: Model{D: D, K: K, NLayer: 4, NExpert: 8}, Fallback: f}}
			out, err := d.computePairs(context.Background(), layer, hidden, ids, K, tc.pairs)
			if err != nil {
				t.Fatal(err)
			}
			if len(out) != len(tc.pairs)*D {
				t.Fatalf("%d outputs, want %d", len(out), len(tc.pairs)*D)
			}
			for q, p := range tc.pairs {
				e := ids[int(p.r)*K+int(p.s)]
				for i := range D {
					if want := hidden[int(p.r)*D+i]*float32(e+1) + float32(layer); out[q*D+i] != want {
						t.Fatalf("pair %d (%d,%d) out[%d] = %v, want %v", q, p.r, p.s, i, out[q*D+i], want)
					}
				}
			}
			var whole, single int
			for _, c := range f.calls {
				if c[1] == K {
					whole += c[0]
				} else {
					single += c[0]
				}
			}
			if whole != tc.wantWhole || single != tc.wantSingle {
				t.Errorf("calls %v: %d whole rows, %d single pairs; want %d, %d", f.calls, whole, single, tc.wantWhole, tc.wantSingle)
			}
		})
	}
}

// TestClipWords: a long reason is cut at a space within the limit, with
// "...", never inside a word or a UTF-8 character; a short one is kept.
func TestClipWords(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"verification failed (request 521): output row 3 differs", 100, "verification failed (request 521): output row 3 differs"},
		{"verification failed (request 521): output row 3 differs", 40, "verification failed (request 521):..."},
		{"ééééééééééééééééééééé", 10, "ééé..."},
	} {
		if got := clipWords(c.in, c.n); got != c.want || len(got) > c.n {
			t.Errorf("clipWords(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}
