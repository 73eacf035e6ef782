package gguf

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// fixtureDir returns the shared fixtures folder: $KVASIR_FIXTURES, or
// ../shared/fixtures next to the repository root (the folder with go.mod).
// It skips the test when the folder is absent.
func fixtureDir(t testing.TB) string {
	t.Helper()
	if d := os.Getenv("KVASIR_FIXTURES"); d != "" {
		return d
	}
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Skip("fixtures absent: no go.mod above the test directory; set KVASIR_FIXTURES")
		}
		dir = parent
	}
	fx := filepath.Join(dir, "..", "shared", "fixtures")
	if _, err := os.Stat(filepath.Join(fx, "refs", "tensor_types.txt")); err != nil {
		t.Skipf("fixtures absent (%s): set KVASIR_FIXTURES to the folder holding tiny-qwen3moe-*.gguf", fx)
	}
	return fx
}

var fixtureModels = []struct {
	file     string
	fileType uint32 // general.file_type: llama_ftype (1 F16, 7 Q8_0, 15 Q4_K_M)
}{
	{"tiny-qwen3moe-F16.gguf", 1},
	{"tiny-qwen3moe-Q8_0.gguf", 7},
	{"tiny-qwen3moe-Q4_K_M.gguf", 15},
}

// refTensor is one line of refs/tensor_types.txt:
//
//	token_embd.weight   ne=[256,50257] F16    bytes=25731584 offset=1770336
//
// where offset is absolute (from the start of the file).
type refTensor struct {
	name   string
	dims   []uint64
	typ    string
	bytes  uint64
	offset uint64
}

var refLine = regexp.MustCompile(`^(\S+)\s+ne=\[([0-9,]+)\]\s+(\S+)\s+bytes=(\d+)\s+offset=(\d+)$`)

// readTensorTypes parses refs/tensor_types.txt into per-file tensor lists
// (in listing order, which is file order).
func readTensorTypes(t *testing.T, path string) map[string][]refTensor {
	t.Helper()
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	out := map[string][]refTensor{}
	var cur string
	sc := bufio.NewScanner(fh)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "":
		case strings.HasPrefix(line, "# "):
			cur = strings.TrimPrefix(line, "# ")
		default:
			m := refLine.FindStringSubmatch(line)
			if m == nil || cur == "" {
				t.Fatalf("%s:%d: cannot parse %q", path, n, line)
			}
			r := refTensor{name: m[1], typ: m[3]}
			for _, s := range strings.Split(m[2], ",") {
				d, _ := strconv.ParseUint(s, 10, 64)
				r.dims = append(r.dims, d)
			}
			r.bytes, _ = strconv.ParseUint(m[4], 10, 64)
			r.offset, _ = strconv.ParseUint(m[5], 10, 64)
			out[cur] = append(out[cur], r)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestFixtureTensors checks every tensor's name, ne, type, size and offset
// against refs/tensor_types.txt, and that each view covers exactly the bytes
// at that offset of the file.
func TestFixtureTensors(t *testing.T) {
	fx := fixtureDir(t)
	refs := readTensorTypes(t, filepath.Join(fx, "refs", "tensor_types.txt"))
	for _, m := range fixtureModels {
		t.Run(m.file, func(t *testing.T) {
			want := refs[m.file]
			if len(want) == 0 {
				t.Fatalf("tensor_types.txt has no section for %s", m.file)
			}
			f, err := Open(filepath.Join(fx, m.file))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			raw, err := os.ReadFile(filepath.Join(fx, m.file))
			if err != nil {
				t.Fatal(err)
			}
			if f.Version != 3 || f.Alignment != 32 {
				t.Errorf("version %d alignment %d, want 3 and 32", f.Version, f.Alignment)
			}
			if len(f.Tensors) != len(want) {
				t.Fatalf("%d tensors, tensor_types.txt lists %d", len(f.Tensors), len(want))
			}
			for i, r := range want {
				ti := f.Tensors[i]
				if ti.Name != r.name {
					t.Errorf("tensor %d: name %q, want %q", i, ti.Name, r.name)
					continue
				}
				if !slices.Equal(ti.Dims, r.dims) || ti.Type.String() != r.typ || ti.Size != r.bytes ||
					f.DataOffset+ti.Offset != r.offset {
					t.Errorf("%s: ne %v %s %d bytes at %d, want ne %v %s %d bytes at %d", r.name,
						ti.Dims, ti.Type, ti.Size, f.DataOffset+ti.Offset, r.dims, r.typ, r.bytes, r.offset)
				}
				tn, err := f.Tensor(r.name)
				if err != nil {
					t.Fatal(err)
				}
				if uint64(len(tn.Data)) != r.bytes || &tn.Data[0] != &f.data[r.offset] {
					t.Errorf("%s: view of %d bytes not at file offset %d", r.name, len(tn.Data), r.offset)
				}
				if string(tn.Data[:min(64, len(tn.Data))]) != string(raw[r.offset:r.offset+min(64, r.bytes)]) {
					t.Errorf("%s: view bytes differ from the file at offset %d", r.name, r.offset)
				}
			}
			if _, err := f.Tensor("output.weight"); !errors.Is(err, ErrNoTensor) {
				t.Errorf("output.weight (tied, absent): err %v, want ErrNoTensor", err)
			}
		})
	}
}

// TestFixtureMetadata checks the metadata values that fixtures/README.md
// states.
func TestFixtureMetadata(t *testing.T) {
	fx := fixtureDir(t)
	for _, m := range fixtureModels {
		t.Run(m.file, func(t *testing.T) {
			f, err := Open(filepath.Join(fx, m.file))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if a := f.Architecture(); a != "qwen3moe" {
				t.Errorf("architecture %q", a)
			}
			strs := map[string]string{
				"general.name": "tiny-qwen3moe-A", "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2",
			}
			for k, want := range strs {
				if got, err := f.String(k); err != nil || got != want {
					t.Errorf("%s = %q, %v; want %q", k, got, err, want)
				}
			}
			uints := map[string]uint64{
				"general.file_type":                   uint64(m.fileType),
				"general.quantization_version":        2,
				"qwen3moe.context_length":             4096,
				"qwen3moe.embedding_length":           256,
				"qwen3moe.block_count":                4,
				"qwen3moe.attention.head_count":       8,
				"qwen3moe.attention.head_count_kv":    2,
				"qwen3moe.attention.key_length":       64,
				"qwen3moe.attention.value_length":     64,
				"qwen3moe.expert_count":               16,
				"qwen3moe.expert_used_count":          4,
				"qwen3moe.expert_feed_forward_length": 256,
				"tokenizer.ggml.bos_token_id":         50256,
				"tokenizer.ggml.eos_token_id":         50256,
			}
			for k, want := range uints {
				if got, err := f.Uint(k); err != nil || got != want {
					t.Errorf("%s = %d, %v; want %d", k, got, err, want)
				}
			}
			// float32 values read exactly: 1e6 is exact, 1e-6 is float32(1e-6).
			floats := map[string]float64{
				"qwen3moe.rope.freq_base": 1e6, "qwen3moe.attention.layer_norm_rms_epsilon": float64(float32(1e-6)),
			}
			for k, want := range floats {
				if got, err := f.Float(k); err != nil || got != want {
					t.Errorf("%s = %g, %v; want %g", k, got, err, want)
				}
			}
			for _, k := range []string{"tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token"} {
				if b, err := f.Bool(k); err != nil || b {
					t.Errorf("%s = %v, %v; want false", k, b, err)
				}
			}
			tokens, err := f.Strings("tokenizer.ggml.tokens")
			if err != nil || len(tokens) != 50257 {
				t.Fatalf("tokens: %d, %v; want 50257", len(tokens), err)
			}
			// GPT-2 encoder.json: id 0 "!", id 50256 "<|endoftext|>", id 464 "The".
			if tokens[0] != "!" || tokens[50256] != "<|endoftext|>" || tokens[464] != "The" {
				t.Errorf("tokens[0,464,50256] = %q %q %q", tokens[0], tokens[464], tokens[50256])
			}
			merges, err := f.Strings("tokenizer.ggml.merges")
			if err != nil || len(merges) != 50000 {
				t.Fatalf("merges: %d, %v; want 50000", len(merges), err)
			}
			if merges[0] != "Ġ t" { // first line of GPT-2 vocab.bpe after #version
				t.Errorf("merges[0] = %q", merges[0])
			}
			types, err := f.Ints("tokenizer.ggml.token_type")
			if err != nil || len(types) != 50257 {
				t.Fatalf("token_type: %d, %v", len(types), err)
			}
			for id, ty := range types {
				want := int64(1)
				if id == 50256 {
					want = 3
				}
				if ty != want {
					t.Fatalf("token_type[%d] = %d, want %d", id, ty, want)
				}
			}
			if v, _ := f.Value("tokenizer.ggml.token_type"); v.ElemType() != TypeInt32 {
				t.Errorf("token_type element type %s, want int32", v.ElemType())
			}
		})
	}
}

// diffWriter compares what is written with want, remembering the first
// differing offset (-1 if none) without buffering the output.
type diffWriter struct {
	want  []byte
	n     int
	first int
}

func (d *diffWriter) Write(p []byte) (int, error) {
	if d.first < 0 {
		rest := d.want[min(d.n, len(d.want)):]
		for i := range p {
			if i >= len(rest) || p[i] != rest[i] {
				d.first = d.n + i
				break
			}
		}
	}
	d.n += len(p)
	return len(p), nil
}

// rewrite writes f's KVs (file order, same types) and tensors (file order)
// through a Writer.
func rewrite(t testing.TB, f *File) *Writer {
	t.Helper()
	w := NewWriter()
	for _, kv := range f.KVs {
		w.Set(kv.Key, kv.Value)
	}
	for _, ti := range f.Tensors {
		tn, err := f.Tensor(ti.Name)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.AddTensor(ti.Name, ti.Type, ti.Dims, tn.Data); err != nil {
			t.Fatal(err)
		}
	}
	return w
}

// TestFixtureRewriteIdentical re-writes each fixture (made by gguf-py and
// llama-quantize) through Writer and requires byte-identical output.
func TestFixtureRewriteIdentical(t *testing.T) {
	fx := fixtureDir(t)
	for _, m := range fixtureModels {
		t.Run(m.file, func(t *testing.T) {
			f, err := Open(filepath.Join(fx, m.file))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			dw := &diffWriter{want: f.data, first: -1}
			n, err := rewrite(t, f).WriteTo(dw)
			if err != nil {
				t.Fatal(err)
			}
			if n != int64(len(f.data)) || dw.first >= 0 {
				t.Fatalf("rewrite: %d bytes (original %d), first difference at byte %d", n, len(f.data), dw.first)
			}
		})
	}
}

// TestFixtureTruncatedMessage checks the full text of the error for a
// fixture cut inside the name of tensor info 17.
func TestFixtureTruncatedMessage(t *testing.T) {
	fx := fixtureDir(t)
	raw, err := os.ReadFile(filepath.Join(fx, fixtureModels[0].file))
	if err != nil {
		t.Fatal(err)
	}
	f, _ := Parse(raw)
	// Cut inside the 17th tensor info's name.
	if len(f.Tensors) < 18 {
		t.Fatal("fixture has fewer than 18 tensors")
	}
	cut := infoOffset(t, f, 17) + 8 + 3
	_, err = Parse(raw[:cut])
	want := fmt.Sprintf("gguf: truncated file: reading tensor info 17 name at offset %d: need %d bytes, 3 left (file is %d bytes)",
		infoOffset(t, f, 17)+8, len(f.Tensors[17].Name), cut)
	if !errors.Is(err, ErrTruncated) || err.Error() != want {
		t.Fatalf("err = %v\nwant %s", err, want)
	}
}

// infoOffset returns the absolute offset of tensor info i, recomputed from
// the encoded sizes of the header, the KVs and the earlier infos.
func infoOffset(t testing.TB, f *File, i int) int {
	t.Helper()
	off := headerBytes
	for _, kv := range f.KVs {
		off += 8 + len(kv.Key) + 4 + encodedSize(kv.Value)
	}
	for _, ti := range f.Tensors[:i] {
		off += 8 + len(ti.Name) + 4 + 8*len(ti.Dims) + 4 + 8
	}
	return off
}

// encodedSize is the payload size of v, computed independently of the
// encoder.
func encodedSize(v Value) int {
	if t := v.Type(); t != TypeArray {
		if s, ok := v.Str(); ok {
			return 8 + len(s)
		}
		return int(t.fixedSize())
	}
	n := 12
	els, _ := v.Values()
	for _, e := range els {
		n += encodedSize(e)
	}
	return n
}

// BenchmarkOpen measures Open+Close of the F16 fixture (55 MB; the cost is
// the metadata: 50257 tokens, 50257 token types, 50000 merges).
func BenchmarkOpen(b *testing.B) {
	path := filepath.Join(fixtureDir(b), fixtureModels[0].file)
	for b.Loop() {
		f, err := Open(path)
		if err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
}
