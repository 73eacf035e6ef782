package slice

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"unicode/utf8"

	"github.com/kvasir-ai/kvasir/engine/quant"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// Manifest is the content of a slice directory's manifest.json. Every field
// is required; Validate states the rules.
type Manifest struct {
	Format       string `json:"format"`       // FormatName
	Version      int    `json:"version"`      // FormatVersion
	ModelID      string `json:"model_id"`     // ModelID's id, 1..wire.MaxModelID bytes of UTF-8
	ModelSHA256  string `json:"model_sha256"` // ModelID's sum, 64 lower-case hex digits
	Architecture string `json:"architecture"` // general.architecture, e.g. "qwen3moe" or "qwen35moe"
	NLayer       int    `json:"n_layer"`      // layers of the model (block_count), 1..MaxLayers
	NExpert      int    `json:"n_expert"`     // experts per layer, 1..MaxExperts
	DModel       int    `json:"d_model"`      // hidden size, elements, 1..MaxDim
	DFF          int    `json:"d_ff"`         // expert FFN size, elements, 1..MaxDim
	// Layers lists the layers with experts in the slice, each layer once.
	Layers []LayerEntry `json:"layers"`
}

// LayerEntry describes one layer of a slice: its tensor types and the
// experts held.
type LayerEntry struct {
	Layer    int    `json:"layer"`     // 0..n_layer-1
	GateType string `json:"gate_type"` // ggml type name of ffn_gate_exps or ffn_gate_up_exps (quant.Type.String, e.g. "Q4_K")
	UpType   string `json:"up_type"`   // ggml type name of ffn_up_exps or ffn_gate_up_exps
	DownType string `json:"down_type"` // ggml type name of ffn_down_exps
	// ExpertBytes is the size in bytes of each expert file of this layer:
	// d_ff*RowBytes(gate, d_model) + d_ff*RowBytes(up, d_model) +
	// d_model*RowBytes(down, d_ff), at most MaxExpertBytes.
	ExpertBytes int64 `json:"expert_bytes"`
	// Experts lists the experts held, each once.
	Experts []ExpertEntry `json:"experts"`
}

// ExpertEntry is one held expert.
type ExpertEntry struct {
	Expert int    `json:"expert"` // 0..n_expert-1
	File   string `json:"file"`   // ExpertFile(layer, expert), exactly
	Bytes  int64  `json:"bytes"`  // file size, equal to the layer's ExpertBytes
	SHA256 string `json:"sha256"` // SHA-256 of the file (gate||up||down), 64 lower-case hex digits
}

// Count returns the number of experts listed.
func (m *Manifest) Count() int {
	n := 0
	for _, l := range m.Layers {
		n += len(l.Experts)
	}
	return n
}

// Bytes returns the total size in bytes of the expert files listed.
func (m *Manifest) Bytes() int64 {
	var n int64
	for _, l := range m.Layers {
		n += l.ExpertBytes * int64(len(l.Experts))
	}
	return n
}

// Types returns the layer's gate, up and down tensor types. Errors wrap
// ErrManifest (unknown name, not written exactly as quant.Type.String, or a
// type that cannot be computed with).
func (l *LayerEntry) Types() (gate, up, down quant.Type, err error) {
	ts := [3]quant.Type{}
	for i, s := range []string{l.GateType, l.UpType, l.DownType} {
		t, e := quant.ParseType(s)
		if e != nil || t.String() != s || !t.Supported() {
			return 0, 0, 0, fmt.Errorf("%w: layer %d: tensor type %q", ErrManifest, l.Layer, s)
		}
		ts[i] = t
	}
	return ts[0], ts[1], ts[2], nil
}

// ExpertBytes returns the size in bytes of one expert file of a layer with
// the given types: d_ff*RowBytes(gate, d_model) + d_ff*RowBytes(up,
// d_model) + d_model*RowBytes(down, d_ff) (the table in docs/slices.md).
// Errors wrap ErrManifest (a type that cannot be computed with or a row
// length that is not a whole number of blocks).
func ExpertBytes(gate, up, down quant.Type, dModel, dFF int) (int64, error) {
	return expertBytes(gate, up, down, dModel, dFF)
}

// expertBytes returns the size of one expert of the given types and shape,
// or an error wrapping ErrManifest.
func expertBytes(gate, up, down quant.Type, dModel, dFF int) (int64, error) {
	g, e1 := gate.RowBytes(dModel)
	u, e2 := up.RowBytes(dModel)
	d, e3 := down.RowBytes(dFF)
	if err := errors.Join(e1, e2, e3); err != nil {
		return 0, fmt.Errorf("%w: d_model %d, d_ff %d: %v", ErrManifest, dModel, dFF, err)
	}
	n := int64(g+u)*int64(dFF) + int64(d)*int64(dModel)
	if n <= 0 || n > MaxExpertBytes {
		return 0, fmt.Errorf("%w: expert of %d bytes (limit %d)", ErrManifest, n, int64(MaxExpertBytes))
	}
	return n, nil
}

// Validate checks m: format and version, model id, shapes within the
// limits, every layer and expert in range and listed once, tensor types
// known and computable, row lengths valid for their types, expert_bytes
// equal to what the shapes imply, each entry's file name canonical, bytes
// equal to expert_bytes, sha256 well formed, and at most MaxEntries experts.
// Errors wrap ErrManifest.
func (m *Manifest) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrManifest}, a...)...)
	}
	switch {
	case m.Format != FormatName:
		return bad("format %q, want %q", clipUTF8(m.Format, 64), FormatName)
	case m.Version != FormatVersion:
		return bad("version %d, this build reads %d", m.Version, FormatVersion)
	case m.ModelID == "" || len(m.ModelID) > wire.MaxModelID || !utf8.ValidString(m.ModelID):
		return bad("model_id of %d bytes (1..%d bytes of UTF-8)", len(m.ModelID), wire.MaxModelID)
	case !isHex32(m.ModelSHA256):
		return bad("model_sha256 is not 64 lower-case hex digits")
	case m.Architecture == "" || len(m.Architecture) > 64:
		return bad("architecture of %d bytes", len(m.Architecture))
	case m.NLayer <= 0 || m.NLayer > MaxLayers:
		return bad("n_layer %d (1..%d)", m.NLayer, MaxLayers)
	case m.NExpert <= 0 || m.NExpert > MaxExperts:
		return bad("n_expert %d (1..%d)", m.NExpert, MaxExperts)
	case m.DModel <= 0 || m.DModel > MaxDim || m.DFF <= 0 || m.DFF > MaxDim:
		return bad("d_model %d, d_ff %d (1..%d)", m.DModel, m.DFF, MaxDim)
	case len(m.Layers) > m.NLayer:
		return bad("%d layers listed, n_layer %d", len(m.Layers), m.NLayer)
	}
	seenLayer := make(map[int]bool, len(m.Layers))
	total := 0
	for i := range m.Layers {
		l := &m.Layers[i]
		if l.Layer < 0 || l.Layer >= m.NLayer {
			return bad("layer %d out of range (n_layer %d)", l.Layer, m.NLayer)
		}
		if seenLayer[l.Layer] {
			return bad("layer %d listed twice", l.Layer)
		}
		seenLayer[l.Layer] = true
		g, u, d, err := l.Types()
		if err != nil {
			return err
		}
		eb, err := expertBytes(g, u, d, m.DModel, m.DFF)
		if err != nil {
			return fmt.Errorf("layer %d: %w", l.Layer, err)
		}
		if l.ExpertBytes != eb {
			return bad("layer %d: expert_bytes %d, the shapes give %d", l.Layer, l.ExpertBytes, eb)
		}
		total += len(l.Experts)
		if len(l.Experts) > m.NExpert || total > MaxEntries {
			return bad("layer %d: %d experts listed (n_expert %d, at most %d in all)", l.Layer, len(l.Experts), m.NExpert, MaxEntries)
		}
		seen := make(map[int]bool, len(l.Experts))
		for _, e := range l.Experts {
			switch {
			case e.Expert < 0 || e.Expert >= m.NExpert:
				return bad("layer %d: expert %d out of range (n_expert %d)", l.Layer, e.Expert, m.NExpert)
			case seen[e.Expert]:
				return bad("layer %d: expert %d listed twice", l.Layer, e.Expert)
			case e.File != ExpertFile(l.Layer, e.Expert):
				return bad("layer %d expert %d: file %q, want %q", l.Layer, e.Expert, clipUTF8(e.File, 64), ExpertFile(l.Layer, e.Expert))
			case e.Bytes != eb:
				return bad("layer %d expert %d: bytes %d, want %d", l.Layer, e.Expert, e.Bytes, eb)
			case !isHex32(e.SHA256):
				return bad("layer %d expert %d: sha256 is not 64 lower-case hex digits", l.Layer, e.Expert)
			}
			seen[e.Expert] = true
		}
	}
	return nil
}

// isHex32 reports whether s is 64 lower-case hex digits.
func isHex32(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// hexSum decodes a string that passed isHex32.
func hexSum(s string) (sum [32]byte) {
	_, _ = hex.Decode(sum[:], []byte(s))
	return sum
}

// ParseManifest decodes and validates a manifest. The JSON must be one
// object with exactly the fields of Manifest (unknown fields, duplicate keys
// in any object and trailing data are errors), at most MaxManifestBytes.
// Errors wrap ErrManifest.
func ParseManifest(data []byte) (*Manifest, error) {
	if len(data) > MaxManifestBytes {
		return nil, fmt.Errorf("%w: %d bytes (limit %d)", ErrManifest, len(data), MaxManifestBytes)
	}
	if err := checkDuplicateKeys(data); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrManifest, err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrManifest, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: data after the manifest object", ErrManifest)
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// maxJSONDepth bounds the nesting checkDuplicateKeys follows (a manifest
// nests 4 deep).
const maxJSONDepth = 16

// checkDuplicateKeys walks data's JSON tokens and fails on a key repeated
// within one object, nesting deeper than maxJSONDepth, or invalid JSON.
func checkDuplicateKeys(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	type frame struct {
		keys   map[string]bool
		object bool
		key    bool // the next string token of an object is a key
	}
	var stack []frame
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		top := len(stack) - 1
		isKey := top >= 0 && stack[top].object && stack[top].key
		if top >= 0 && stack[top].object {
			stack[top].key = !stack[top].key
		}
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{', '[':
				if len(stack) >= maxJSONDepth {
					return fmt.Errorf("JSON nested deeper than %d", maxJSONDepth)
				}
				stack = append(stack, frame{keys: map[string]bool{}, object: t == '{', key: t == '{'})
			default:
				stack = stack[:top]
				if top > 0 && stack[top-1].object {
					// The closed value was a member value: the next token is a key.
					stack[top-1].key = true
				}
			}
		case string:
			if isKey {
				if stack[top].keys[t] {
					return fmt.Errorf("duplicate key %q", clipUTF8(t, 64))
				}
				stack[top].keys[t] = true
			}
		}
	}
}

// ReadManifest reads and validates DIR/manifest.json. Errors wrap
// ErrManifest (also for a missing file, which additionally wraps
// fs.ErrNotExist).
func ReadManifest(dir string) (*Manifest, error) {
	f, err := os.Open(filepath.Join(dir, ManifestName))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrManifest, err)
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > MaxManifestBytes {
		return nil, fmt.Errorf("%w: %s: %d bytes (limit %d)", ErrManifest, f.Name(), st.Size(), MaxManifestBytes)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxManifestBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrManifest, f.Name(), err)
	}
	m, err := ParseManifest(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f.Name(), err)
	}
	return m, nil
}

// Marshal returns the manifest's JSON (indented, with a final newline) after
// validating it. Errors wrap ErrManifest.
func (m *Manifest) Marshal() ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrManifest, err)
	}
	return append(b, '\n'), nil
}

// WriteManifest validates m and writes it to DIR/manifest.json atomically
// (temporary file, fsync, rename, fsync of DIR). Errors wrap ErrManifest or
// are the file system's.
func WriteManifest(dir string, m *Manifest) error {
	b, err := m.Marshal()
	if err != nil {
		return err
	}
	if err := writeAtomic(filepath.Join(dir, ManifestName), b); err != nil {
		return err
	}
	return syncDir(dir)
}

// String summarises the manifest: "<model_id>: N experts in L layers, B bytes".
func (m *Manifest) String() string {
	return fmt.Sprintf("%s: %d experts in %d layers, %d bytes", m.ModelID, m.Count(), len(m.Layers), m.Bytes())
}
