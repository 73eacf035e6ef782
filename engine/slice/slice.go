// Package slice cuts, stores and opens a worker's expert slice: some layers'
// experts of a Mixture-of-Experts GGUF model, one file per (layer, expert),
// plus a manifest that names each file with its size and SHA-256.
//
// # Directory format (version 1; also docs/slices.md)
//
//	DIR/manifest.json        the manifest (JSON, at most MaxManifestBytes)
//	DIR/L003/E0042.bin       layer 3, expert 42: gate || up || down
//
// An expert file holds expert e's three matrices back to back, each exactly
// as stored in the GGUF (native ggml type, row-major, row r at byte offset
// r*RowBytes(cols), one ne[2] slice of blk.N.ffn_{gate,up,down}_exps.weight;
// in a file with llama.cpp's fused blk.N.ffn_gate_up_exps.weight, gate is the
// first d_ff rows of its ne[2] slice e and up the next d_ff, see
// expert.FromGGUF, so both layouts of the same weights give the same bytes):
//
//	gate  d_ff x d_model  of gate_type  ((d_ff    * RowBytes(gate_type, d_model)) bytes)
//	up    d_ff x d_model  of up_type    ((d_ff    * RowBytes(up_type,   d_model)) bytes)
//	down  d_model x d_ff  of down_type  ((d_model * RowBytes(down_type, d_ff))    bytes)
//
// with no header or padding, so the file's SHA-256 (what `sha256sum` prints)
// is the expert's hash: SHA-256(gate || up || down). HashExpert computes the
// same hash from an expert.Layer (a GGUF view or a slice) and it is the hash a
// worker announces for the expert in HELLO (wire.Holding.SHA256).
//
// The file name of (layer l, expert e) is fmt.Sprintf("L%03d/E%04d.bin", l, e)
// (ExpertFile); the manifest must use exactly that name, so a manifest can
// never point outside its directory.
//
// Any architecture whose layers 0..block_count-1 all carry these expert
// tensors can be sliced (qwen3moe, qwen35moe): the architecture comes from
// general.architecture and the layer count from "<architecture>.block_count".
//
// The manifest (see Manifest for every field) carries the format version,
// the model id (ModelID), the shapes every expert file must have (n_layer,
// n_expert, d_model, d_ff and per layer the three tensor types) and one entry
// per held expert: file, bytes, sha256 (64 lower-case hex digits).
//
// # Writing and opening
//
// Cut writes each expert to a temporary file in its layer folder, fsyncs it
// and renames it into place, then writes the manifest the same way last: a
// directory with a manifest.json is always complete, and a crash leaves at
// worst stray ".E*.tmp*" files that Open ignores. Downloads (one expert at a
// time) use the same steps: WriteExpert, then WriteManifest.
//
// Open reads the manifest strictly (unknown fields, duplicate keys, trailing
// data, out-of-range shapes or counts are errors), maps every expert file and
// checks its size and SHA-256 before anything is served. A missing,
// truncated or corrupt expert is excluded from the Slice (not in Layers,
// Holdings or the Computer) and listed by Bad, so that it can be fetched
// again. Expert files must not be modified in place while a Slice maps them:
// replace them by rename (as WriteExpert does).
package slice

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// Sentinel errors; returned errors wrap one of them.
var (
	// ErrManifest: manifest.json is missing, not valid strict JSON, of an
	// unknown format or version, or describes impossible shapes or counts.
	ErrManifest = errors.New("slice: bad manifest")
	// ErrMissing: an expert file named by the manifest does not exist (or
	// is not a regular file).
	ErrMissing = errors.New("slice: expert file missing")
	// ErrSize: an expert file's size differs from the manifest's (a
	// truncated or overlong file).
	ErrSize = errors.New("slice: expert file has the wrong size")
	// ErrCorrupt: an expert file's SHA-256 differs from the manifest's.
	ErrCorrupt = errors.New("slice: expert file hash mismatch")
	// ErrModel: the GGUF model cannot be sliced (no general.architecture,
	// missing or out-of-range <architecture>.block_count, layers that
	// disagree in shape). A layer without usable expert tensors gives
	// expert.FromGGUF's error (gguf.ErrNoTensor, expert.ErrShape) instead.
	ErrModel = errors.New("slice: unsuitable model")
	// ErrSelection: a layer or expert selection is out of range, repeated
	// or unparsable.
	ErrSelection = errors.New("slice: bad layer or expert selection")
	// ErrDir: the output directory is neither empty nor a slice directory.
	ErrDir = errors.New("slice: output directory is not empty and holds no slice")
)

// Format constants of the slice directory.
const (
	// FormatName is the manifest's "format" value.
	FormatName = "kvasir-slice"
	// FormatVersion is the manifest version this package reads and writes.
	//
	// Changelog:
	//
	//	1 (2026-11): first version.
	FormatVersion = 1
	// ManifestName is the manifest's file name inside the slice directory.
	ManifestName = "manifest.json"
)

// Hard limits on what a manifest may declare (the first two match the
// protocol: wire.Holding has a uint16 layer and HELLO at most
// wire.MaxHoldings entries).
const (
	MaxLayers        = 1 << 16 // n_layer
	MaxExperts       = 1 << 20 // n_expert
	MaxDim           = 1 << 20 // d_model and d_ff, elements
	MaxExpertBytes   = 4 << 30 // one expert file, bytes
	MaxEntries       = wire.MaxHoldings
	MaxManifestBytes = 256 << 20 // manifest.json, bytes
)

// ExpertFile returns the slash-separated path, relative to the slice
// directory, of expert e of layer l: "L%03d/E%04d.bin" (e.g. "L003/E0042.bin").
func ExpertFile(l, e int) string { return fmt.Sprintf("L%03d/E%04d.bin", l, e) }

// HashExpert returns SHA-256(gate || up || down) over expert e's three
// matrices of l as stored (native type, ggml row layout): the hash of the
// expert file and of the expert's wire.Holding. ok is false, and sum zero,
// when l does not hold e.
func HashExpert(l *expert.Layer, e int) (sum [32]byte, ok bool) {
	if l == nil || !l.Held(e) {
		return sum, false
	}
	h := sha256.New()
	h.Write(l.Gate.Expert[e])
	h.Write(l.Up.Expert[e])
	h.Write(l.Down.Expert[e])
	h.Sum(sum[:0])
	return sum, true
}

// modelIDTag versions the ModelID hash input.
const modelIDTag = "kvasir-model-id-v1"

// ModelID identifies the model of f for HELLO and manifests: the model's
// name (general.name, else the architecture, else "gguf"; clipped to at most
// wire.MaxModelID-17 bytes at a UTF-8 boundary), "@", and the first 16 hex
// digits of sum. sum is SHA-256 over, each string as a uint64 LE length then
// its bytes and each number as uint64 LE:
//
//	"kvasir-model-id-v1", general.architecture, general.name,
//	count, then per metadata key starting with "<architecture>." in byte
//	order: key, value type name, fmt.Sprint of the value,
//	count, then per tensor in name order: name, ggml type id, n_dims, ne...
//
// It so covers the hyperparameters and every tensor's name, type and shape
// (a Q4_K_M and a Q8_0 quantisation of one model differ), not the weights:
// each expert's weights are identified by its own HashExpert.
func ModelID(f *gguf.File) (id string, sum [32]byte) {
	h := sha256.New()
	var n [8]byte
	num := func(x uint64) {
		binary.LittleEndian.PutUint64(n[:], x)
		h.Write(n[:])
	}
	str := func(s string) {
		num(uint64(len(s)))
		h.Write([]byte(s))
	}
	arch := f.Architecture()
	name, _ := f.String("general.name")
	str(modelIDTag)
	str(arch)
	str(name)
	var keys []string
	for _, kv := range f.KVs {
		if arch != "" && strings.HasPrefix(kv.Key, arch+".") {
			keys = append(keys, kv.Key)
		}
	}
	slices.Sort(keys)
	num(uint64(len(keys)))
	for _, k := range keys {
		v, _ := f.Value(k)
		str(k)
		str(v.TypeName())
		str(fmt.Sprint(v.Any()))
	}
	ts := slices.Clone(f.Tensors)
	slices.SortFunc(ts, func(a, b gguf.TensorInfo) int { return strings.Compare(a.Name, b.Name) })
	num(uint64(len(ts)))
	for _, t := range ts {
		str(t.Name)
		num(uint64(t.Type))
		num(uint64(len(t.Dims)))
		for _, d := range t.Dims {
			num(d)
		}
	}
	h.Sum(sum[:0])
	label := name
	if label == "" {
		label = arch
	}
	if label == "" {
		label = "gguf"
	}
	label = clipUTF8(label, wire.MaxModelID-17)
	return fmt.Sprintf("%s@%x", label, sum[:8]), sum
}

// clipUTF8 returns s cut to at most n bytes, not inside a UTF-8 sequence,
// with invalid UTF-8 replaced so the result is valid.
func clipUTF8(s string, n int) string {
	s = strings.ToValidUTF8(s, "?")
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
