package quant

import (
	"bufio"
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// fixtureDir is the shared llama.cpp fixture folder (see its README.md).
const fixtureDir = "../../../shared/fixtures"

type fixtureTensor struct {
	typ    Type
	bytes  int
	offset int64
}

// loadTensorTable parses fixtures/refs/tensor_types.txt: "# FILE" headers
// followed by "name ne=[..] TYPE bytes=N offset=M" lines (absolute file
// offsets), into file -> tensor name -> info. It skips the test when the
// fixtures are absent.
func loadTensorTable(t *testing.T) map[string]map[string]fixtureTensor {
	t.Helper()
	f, err := os.Open(filepath.Join(fixtureDir, "refs", "tensor_types.txt"))
	if err != nil {
		t.Skipf("fixtures not available (%v); the llama.cpp cross-checks are skipped", err)
	}
	defer f.Close()
	out := map[string]map[string]fixtureTensor{}
	var cur map[string]fixtureTensor
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if file, ok := strings.CutPrefix(line, "# "); ok {
			cur = map[string]fixtureTensor{}
			out[file] = cur
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 5 || cur == nil {
			continue
		}
		typ, err := ParseType(fields[2])
		if err != nil {
			t.Fatalf("tensor_types.txt: %v", err)
		}
		n, err1 := strconv.Atoi(strings.TrimPrefix(fields[3], "bytes="))
		off, err2 := strconv.ParseInt(strings.TrimPrefix(fields[4], "offset="), 10, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("tensor_types.txt: bad line %q", line)
		}
		cur[fields[0]] = fixtureTensor{typ, n, off}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// readTensor reads the first `rows` rows of 256 elements of a fixture tensor.
func readTensor(t *testing.T, tab map[string]map[string]fixtureTensor, file, name string, rows int) (Type, []byte) {
	t.Helper()
	ti, ok := tab[file][name]
	if !ok {
		t.Fatalf("%s: no tensor %s", file, name)
	}
	rb, err := ti.typ.RowBytes(256)
	if err != nil {
		t.Fatal(err)
	}
	n := min(ti.bytes, rows*rb)
	f, err := os.Open(filepath.Join(fixtureDir, file))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, ti.offset); err != nil {
		t.Fatalf("%s %s: %v", file, name, err)
	}
	return ti.typ, b
}

// TestFixtureQuantization checks the block layouts and the reference
// quantizers against llama-quantize's output: models B (Q8_0) and C
// (Q4_K_M) were made by llama-quantize from the F16 model A at @3f545bec,
// whose quantize_q8_0/q4_K/q6_K call quantize_row_*_ref when there is no
// importance matrix. So Quantize(A's values) must reproduce B's and C's
// bytes, and Dequantize(B or C) must be finite and close to A.
func TestFixtureQuantization(t *testing.T) {
	tab := loadTensorTable(t)
	const fileA = "tiny-qwen3moe-F16.gguf"
	cases := []struct {
		file, name string
		rows       int
		want       Type
	}{
		{"tiny-qwen3moe-Q8_0.gguf", "blk.0.ffn_gate_exps.weight", 4096, Q8_0},
		{"tiny-qwen3moe-Q8_0.gguf", "blk.0.ffn_down_exps.weight", 4096, Q8_0},
		{"tiny-qwen3moe-Q8_0.gguf", "token_embd.weight", 1024, Q8_0},
		{"tiny-qwen3moe-Q4_K_M.gguf", "blk.0.ffn_gate_exps.weight", 4096, Q4_K},
		{"tiny-qwen3moe-Q4_K_M.gguf", "blk.0.ffn_up_exps.weight", 4096, Q4_K},
		{"tiny-qwen3moe-Q4_K_M.gguf", "blk.0.ffn_down_exps.weight", 4096, Q4_K},
		{"tiny-qwen3moe-Q4_K_M.gguf", "blk.2.ffn_down_exps.weight", 4096, Q6_K},
		{"tiny-qwen3moe-Q4_K_M.gguf", "blk.2.attn_v.weight", 128, Q6_K},
		{"tiny-qwen3moe-Q4_K_M.gguf", "token_embd.weight", 1024, Q6_K},
	}
	for _, c := range cases {
		ta, raw := readTensor(t, tab, fileA, c.name, c.rows)
		tq, qb := readTensor(t, tab, c.file, c.name, c.rows)
		if ta != F16 || tq != c.want {
			t.Fatalf("%s: types %s/%s, want F16/%s", c.name, ta, tq, c.want)
		}
		n := len(raw) / 2
		x := make([]float32, n)
		if err := Dequantize(F16, raw, x); err != nil {
			t.Fatal(err)
		}
		y := make([]float32, n)
		if err := Dequantize(tq, qb, y); err != nil {
			t.Fatalf("%s %s: %v", c.file, c.name, err)
		}
		for i := range y {
			if v := float64(y[i]); math.IsNaN(v) || math.IsInf(v, 0) {
				t.Fatalf("%s %s: element %d = %v", c.file, c.name, i, v)
			}
			if v := float64(x[i]); math.IsNaN(v) || math.IsInf(v, 0) {
				t.Fatalf("%s %s: element %d = %v", fileA, c.name, i, v)
			}
		}
		e := rmsRel(x, y)
		mine := make([]byte, len(qb))
		if err := Quantize(tq, x, mine); err != nil {
			t.Fatal(err)
		}
		bb := tq.BlockBytes()
		diff := 0
		for i := 0; i < len(qb); i += bb {
			if !bytes.Equal(qb[i:i+bb], mine[i:i+bb]) {
				diff++
			}
		}
		t.Logf("%-26s %-5s %d elems: rms rel (llama-quantize vs F16) %.4f, blocks differing from Quantize %d/%d", c.name, tq, n, e, diff, len(qb)/bb)
		if e > 0.09 {
			t.Errorf("%s %s: dequantized differs from the F16 source by rms rel %.4f", c.file, c.name, e)
		}
		if diff != 0 {
			t.Errorf("%s %s: %d of %d blocks differ from llama-quantize", c.file, c.name, diff, len(qb)/bb)
		}
	}
}
