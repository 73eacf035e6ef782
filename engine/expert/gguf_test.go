package expert

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/quant"
)

// moeWeights are the stacked expert tensors of the layers of a synthetic
// MoE model: gate[l], up[l] (ne [d, dff, nExpert]) and down[l] (ne [dff, d,
// nExpert]), as GGUF stores them.
type moeWeights struct {
	nExpert, d, dff  int
	gateUpT, downT   quant.Type
	gate, up, down   [][]byte
	gateUpRowsPerExp int // rows per expert written for the fused tensor (normally 2*dff)
}

// randWeights returns random weights of nLayer layers: gate and up of type
// gu, down of type dn (F16 or Q8_0).
func randWeights(t testing.TB, nLayer, nExpert, d, dff int, gu, dn quant.Type, seed uint64) *moeWeights {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 2))
	gen := func(typ quant.Type, n, cols int) []byte {
		switch typ {
		case quant.F16:
			b, _ := randF16(rng, n, 1/math.Sqrt(float64(cols)))
			return b
		case quant.Q8_0:
			return randQ8_0(rng, n)
		}
		t.Fatalf("no synthetic %v", typ)
		return nil
	}
	w := &moeWeights{nExpert: nExpert, d: d, dff: dff, gateUpT: gu, downT: dn, gateUpRowsPerExp: 2 * dff}
	for range nLayer {
		w.gate = append(w.gate, gen(gu, nExpert*dff*d, d))
		w.up = append(w.up, gen(gu, nExpert*dff*d, d))
		w.down = append(w.down, gen(dn, nExpert*d*dff, dff))
	}
	return w
}

// fused returns layer l's ffn_gate_up_exps data: per expert, its gate rows
// then its up rows (llama.cpp's fused layout), padded with extra copies of
// the expert's first up rows when gateUpRowsPerExp > 2*dff (or cut short
// when smaller) to make malformed files.
func (w *moeWeights) fused(l int) []byte {
	rb, _ := w.gateUpT.RowBytes(w.d)
	per := w.dff * rb
	var out []byte
	for e := range w.nExpert {
		g := w.gate[l][e*per : (e+1)*per]
		u := w.up[l][e*per : (e+1)*per]
		ex := append(append([]byte(nil), g...), u...)
		for len(ex) < w.gateUpRowsPerExp*rb {
			ex = append(ex, u[:rb]...)
		}
		out = append(out, ex[:w.gateUpRowsPerExp*rb]...)
	}
	return out
}

// layout says which expert gate/up tensors a synthetic file carries.
type layout int

const (
	separate layout = iota // ffn_gate_exps + ffn_up_exps
	fusedGU                // ffn_gate_up_exps
	both                   // all three (invalid)
	neither                // none (invalid)
	gateOnly               // ffn_gate_exps alone (invalid)
)

// buildGGUF writes w as a qwen35moe-style GGUF in the given layout and
// parses it from memory.
func buildGGUF(t testing.TB, w *moeWeights, lay layout) *gguf.File {
	t.Helper()
	gw := gguf.NewWriter()
	gw.SetString("general.architecture", "qwen35moe")
	gw.SetString("general.name", "synthetic")
	gw.SetUint32("qwen35moe.block_count", uint32(len(w.gate)))
	gw.SetUint32("qwen35moe.expert_count", uint32(w.nExpert))
	gw.SetUint32("qwen35moe.embedding_length", uint32(w.d))
	gw.SetUint32("qwen35moe.expert_feed_forward_length", uint32(w.dff))
	add := func(name string, typ quant.Type, dims []uint64, data []byte) {
		if err := gw.AddTensor(name, typ, dims, data); err != nil {
			t.Fatal(err)
		}
	}
	d, dff, ne := uint64(w.d), uint64(w.dff), uint64(w.nExpert)
	for l := range w.gate {
		name := func(s string) string { return fmt.Sprintf("blk.%d.%s.weight", l, s) }
		if lay == separate || lay == both || lay == gateOnly {
			add(name("ffn_gate_exps"), w.gateUpT, []uint64{d, dff, ne}, w.gate[l])
		}
		if lay == separate || lay == both {
			add(name("ffn_up_exps"), w.gateUpT, []uint64{d, dff, ne}, w.up[l])
		}
		if lay == fusedGU || lay == both {
			add(name("ffn_gate_up_exps"), w.gateUpT, []uint64{d, uint64(w.gateUpRowsPerExp), ne}, w.fused(l))
		}
		add(name("ffn_down_exps"), w.downT, []uint64{dff, d, ne}, w.down[l])
	}
	var b bytes.Buffer
	if _, err := gw.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(b.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestFromGGUFFusedMatchesSeparate: the same weights written with separate
// ffn_gate_exps/ffn_up_exps and with a fused ffn_gate_up_exps give layers
// with byte-identical expert matrices (the fused ones zero-copy views of the
// file) and bit-identical Local outputs on random rows.
func TestFromGGUFFusedMatchesSeparate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		gu, dn quant.Type
	}{{"Q8_0", quant.Q8_0, quant.Q8_0}, {"F16", quant.F16, quant.F16}, {"Q8_0+F16down", quant.Q8_0, quant.F16}} {
		t.Run(tc.name, func(t *testing.T) {
			const nLayer, nExpert, d, dff, n, k = 2, 8, 64, 96, 24, 3
			w := randWeights(t, nLayer, nExpert, d, dff, tc.gu, tc.dn, 21)
			fs, ff := buildGGUF(t, w, separate), buildGGUF(t, w, fusedGU)
			var ls, lf []*Layer
			for blk := range nLayer {
				a, err := FromGGUF(fs, blk)
				if err != nil {
					t.Fatalf("separate blk %d: %v", blk, err)
				}
				b, err := FromGGUF(ff, blk)
				if err != nil {
					t.Fatalf("fused blk %d: %v", blk, err)
				}
				if b.NExpert != nExpert || b.DModel != d || b.DFF != dff || b.Gate.Type != tc.gu || b.Up.Type != tc.gu || b.Down.Type != tc.dn {
					t.Fatalf("fused blk %d: %d experts, d %d, ff %d, types %v %v %v", blk, b.NExpert, b.DModel, b.DFF, b.Gate.Type, b.Up.Type, b.Down.Type)
				}
				gu, err := ff.Tensor(fmt.Sprintf("blk.%d.ffn_gate_up_exps.weight", blk))
				if err != nil {
					t.Fatal(err)
				}
				rb, _ := tc.gu.RowBytes(d)
				per := dff * rb
				for e := range nExpert {
					if !bytes.Equal(a.Gate.Expert[e], b.Gate.Expert[e]) || !bytes.Equal(a.Up.Expert[e], b.Up.Expert[e]) ||
						!bytes.Equal(a.Down.Expert[e], b.Down.Expert[e]) {
						t.Fatalf("blk %d expert %d: fused bytes differ from separate", blk, e)
					}
					if &b.Gate.Expert[e][0] != &gu.Data[2*e*per] || &b.Up.Expert[e][0] != &gu.Data[(2*e+1)*per] ||
						cap(b.Gate.Expert[e]) != per || cap(b.Up.Expert[e]) != per {
						t.Fatalf("blk %d expert %d: fused gate/up are not capacity-limited views of ffn_gate_up_exps", blk, e)
					}
				}
				ls, lf = append(ls, a), append(lf, b)
			}
			cs, err := NewLocal(ls, 2)
			if err != nil {
				t.Fatal(err)
			}
			cf, err := NewLocal(lf, 2)
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(4, 4))
			for blk := range nLayer {
				x, ids := randRows(rng, n, d, k, nExpert)
				want, got := make([]float32, n*k*d), make([]float32, n*k*d)
				if err := cs.ComputeExperts(context.Background(), blk, x, ids, n, k, want); err != nil {
					t.Fatal(err)
				}
				if err := cf.ComputeExperts(context.Background(), blk, x, ids, n, k, got); err != nil {
					t.Fatal(err)
				}
				assertBits(t, got, want, "blk %d fused vs separate", blk)
			}
		})
	}
}

// TestFromGGUFLayoutErrors: both layouts, neither, half of the separate
// one, a fused tensor of the wrong row count or rank, and separate tensors
// of disagreeing shapes are refused with the documented sentinels.
func TestFromGGUFLayoutErrors(t *testing.T) {
	const nExpert, d, dff = 4, 32, 32
	w := randWeights(t, 1, nExpert, d, dff, quant.Q8_0, quant.Q8_0, 5)
	for _, tc := range []struct {
		name string
		f    *gguf.File
		want error
	}{
		{"both layouts", buildGGUF(t, w, both), ErrShape},
		{"neither layout", buildGGUF(t, w, neither), gguf.ErrNoTensor},
		{"gate without up", buildGGUF(t, w, gateOnly), gguf.ErrNoTensor},
	} {
		if _, err := FromGGUF(tc.f, 0); !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		} else {
			t.Logf("%s: %v", tc.name, err)
		}
	}
	for _, rows := range []int{2*dff + 2, 2*dff - 1, dff} {
		bad := *w
		bad.gateUpRowsPerExp = rows
		if _, err := FromGGUF(buildGGUF(t, &bad, fusedGU), 0); !errors.Is(err, ErrShape) {
			t.Errorf("fused with %d rows per expert (d_ff %d): got %v, want ErrShape", rows, dff, err)
		} else {
			t.Logf("fused with %d rows: %v", rows, err)
		}
	}
	if _, err := FromGGUF(buildGGUF(t, w, separate), 1); !errors.Is(err, gguf.ErrNoTensor) {
		t.Errorf("missing layer: got %v, want gguf.ErrNoTensor", err)
	}

	// Hand-made files: a 2-D fused tensor, a gate of the wrong d_ff, no down.
	rb, _ := quant.Q8_0.RowBytes(d)
	for _, tc := range []struct {
		name    string
		tensors map[string][]uint64
		want    error
	}{
		{"2-D fused", map[string][]uint64{"ffn_gate_up_exps": {d, 2 * dff * nExpert}, "ffn_down_exps": {dff, d, nExpert}}, ErrShape},
		{"gate d_ff disagrees", map[string][]uint64{"ffn_gate_exps": {d, 2 * dff, nExpert}, "ffn_up_exps": {d, dff, nExpert}, "ffn_down_exps": {dff, d, nExpert}}, ErrShape},
		{"fused expert count disagrees", map[string][]uint64{"ffn_gate_up_exps": {d, 2 * dff, nExpert / 2}, "ffn_down_exps": {dff, d, nExpert}}, ErrShape},
		{"no down", map[string][]uint64{"ffn_gate_up_exps": {d, 2 * dff, nExpert}}, gguf.ErrNoTensor},
	} {
		gw := gguf.NewWriter()
		gw.SetString("general.architecture", "qwen35moe")
		for n, dims := range tc.tensors {
			rows := 1
			for _, x := range dims[1:] {
				rows *= int(x)
			}
			if err := gw.AddTensor("blk.0."+n+".weight", quant.Q8_0, dims, make([]byte, rows*rb)); err != nil {
				t.Fatal(err)
			}
		}
		var b bytes.Buffer
		if _, err := gw.WriteTo(&b); err != nil {
			t.Fatal(err)
		}
		f, err := gguf.Parse(b.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := FromGGUF(f, 0); !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}

	if _, err := StackedGateUpLayer(nExpert, d, dff, quant.Q8_0, make([]byte, nExpert*2*dff*rb-rb), quant.Q8_0, make([]byte, nExpert*dff*rb)); !errors.Is(err, ErrShape) {
		t.Errorf("StackedGateUpLayer with short data: %v", err)
	}
	if _, err := StackedGateUpLayer(0, d, dff, quant.Q8_0, nil, quant.Q8_0, nil); !errors.Is(err, ErrShape) {
		t.Errorf("StackedGateUpLayer with no experts: %v", err)
	}
}

// TestFromGGUFQwen35moeFixture loads every layer of the qwen35moe fixture
// (16 experts, d_model 256, expert d_ff 128 per its README) in both
// quantisations and checks the layer computes.
func TestFromGGUFQwen35moeFixture(t *testing.T) {
	dir := filepath.Join(fixtures, "qwen35moe")
	if _, err := os.Stat(dir); err != nil {
		t.Skipf("qwen35moe fixtures not found at %s: skipped", dir)
	}
	for _, name := range []string{"tiny-qwen35moe-F16.gguf", "tiny-qwen35moe-Q4_K_M.gguf"} {
		f, err := gguf.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if a := f.Architecture(); a != "qwen35moe" {
			t.Fatalf("%s: architecture %q", name, a)
		}
		nl, err := f.Uint("qwen35moe.block_count")
		if err != nil || nl != 4 {
			t.Fatalf("%s: block_count %d, %v", name, nl, err)
		}
		layers := make([]*Layer, nl)
		for blk := range layers {
			l, err := FromGGUF(f, blk)
			if err != nil {
				t.Fatalf("%s blk %d: %v", name, blk, err)
			}
			if l.NExpert != 16 || l.DModel != 256 || l.DFF != 128 {
				t.Fatalf("%s blk %d: %d experts, d %d, ff %d", name, blk, l.NExpert, l.DModel, l.DFF)
			}
			layers[blk] = l
		}
		c, err := NewLocal(layers, 2)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		const n, k = 4, 4
		x, ids := randRows(rand.New(rand.NewPCG(8, 8)), n, 256, k, 16)
		out := make([]float32, n*k*256)
		for blk := range layers {
			if err := c.ComputeExperts(context.Background(), blk, x, ids, n, k, out); err != nil {
				t.Fatalf("%s blk %d: %v", name, blk, err)
			}
		}
		t.Logf("%s: 4 layers, types gate %v up %v down %v (blk 0), %v (blk 3)", name,
			layers[0].Gate.Type, layers[0].Up.Type, layers[0].Down.Type, layers[3].Down.Type)
	}
}
