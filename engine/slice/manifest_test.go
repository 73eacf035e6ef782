package slice

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// handManifest is a valid manifest worked out by hand: Q8_0 rows of 256
// elements are 8 blocks x 34 bytes = 272 bytes, Q6_K rows of 256 are one
// 210-byte block, so an expert of d_model = d_ff = 256 with Q8_0 gate and up
// and Q6_K down is 256*272 + 256*272 + 256*210 = 193024 bytes.
const handManifest = `{
  "format": "kvasir-slice",
  "version": 1,
  "model_id": "hand@0011223344556677",
  "model_sha256": "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
  "architecture": "qwen3moe",
  "n_layer": 4,
  "n_expert": 8,
  "d_model": 256,
  "d_ff": 256,
  "layers": [
    {
      "layer": 2,
      "gate_type": "Q8_0",
      "up_type": "Q8_0",
      "down_type": "Q6_K",
      "expert_bytes": 193024,
      "experts": [
        {"expert": 0, "file": "L002/E0000.bin", "bytes": 193024, "sha256": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"expert": 7, "file": "L002/E0007.bin", "bytes": 193024, "sha256": "0000000000000000000000000000000000000000000000000000000000000000"}
      ]
    }
  ]
}
`

func TestParseManifestHandWorked(t *testing.T) {
	m, err := ParseManifest([]byte(handManifest))
	if err != nil {
		t.Fatal(err)
	}
	if m.Count() != 2 || m.Bytes() != 2*193024 || m.Layers[0].Experts[1].Expert != 7 {
		t.Fatalf("parsed %+v", m)
	}
	b, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	m2, err := ParseManifest(b)
	if err != nil || !reflect.DeepEqual(m, m2) {
		t.Fatalf("round trip: %v", err)
	}
}

// TestParseManifestErrors mutates the hand-worked manifest into each kind
// of invalid one and checks the error wraps ErrManifest and names the cause.
func TestParseManifestErrors(t *testing.T) {
	for _, c := range []struct {
		name, old, new, want string
	}{
		{"unknown version", `"version": 1`, `"version": 2`, "version 2"},
		{"version zero", `"version": 1`, `"version": 0`, "version 0"},
		{"no version", `"version": 1,`, ``, "version 0"},
		{"format", `"kvasir-slice"`, `"other"`, "format"},
		{"huge n_expert", `"n_expert": 8`, `"n_expert": 1099511627776`, "n_expert"},
		{"n_layer overflow", `"n_layer": 4`, `"n_layer": 1e30`, "n_layer"},
		{"n_layer float", `"n_layer": 4`, `"n_layer": 4.5`, "n_layer"},
		{"negative d_ff", `"d_ff": 256`, `"d_ff": -256`, "d_ff"},
		{"huge d_model", `"d_model": 256`, `"d_model": 16777216`, "d_model"},
		{"d_model not a block multiple", `"d_model": 256`, `"d_model": 250`, "d_model 250"},
		{"expert too big", "\"d_model\": 256,\n  \"d_ff\": 256", "\"d_model\": 1048576,\n  \"d_ff\": 1048576", "limit"},
		{"wrong expert_bytes", `"expert_bytes": 193024`, `"expert_bytes": 193023`, "expert_bytes"},
		{"wrong entry bytes", `E0000.bin", "bytes": 193024`, `E0000.bin", "bytes": 1`, "bytes 1"},
		{"layer out of range", `"layer": 2`, `"layer": 4`, "layer 4 out of range"},
		{"expert out of range", `"expert": 7`, `"expert": 8`, "expert 8 out of range"},
		{"duplicate expert", `"expert": 7, "file": "L002/E0007.bin"`, `"expert": 0, "file": "L002/E0000.bin"`, "listed twice"},
		{"path traversal", `"L002/E0007.bin"`, `"../../etc/passwd"`, "file"},
		{"non-canonical name", `"L002/E0007.bin"`, `"L2/E7.bin"`, "file"},
		{"upper-case hash", `"e3b0c442`, `"E3B0C442`, "sha256"},
		{"short hash", `"e3b0c442`, `"e3b0`, "sha256"},
		{"bad model hash", `"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"`, `"xyz"`, "model_sha256"},
		{"empty model id", `"hand@0011223344556677"`, `""`, "model_id"},
		{"lower-case type", `"gate_type": "Q8_0"`, `"gate_type": "q8_0"`, "tensor type"},
		{"unknown type", `"gate_type": "Q8_0"`, `"gate_type": "Q9_9"`, "tensor type"},
		{"uncomputable type", `"up_type": "Q8_0"`, `"up_type": "Q2_K"`, "tensor type"},
		{"unknown field", `"version": 1,`, `"version": 1, "extra": true,`, "unknown field"},
		{"duplicate key", `"version": 1,`, `"version": 1, "version": 1,`, "duplicate key"},
		{"duplicate nested key", `"expert": 7,`, `"expert": 7, "expert": 7,`, "duplicate key"},
		{"trailing data", "  ]\n}\n", "  ]\n}\n{}", "after"},
		{"wrong type", `"n_layer": 4`, `"n_layer": "4"`, "n_layer"},
		{"truncated", `"layers": [`, `"layers": `, ""},
		{"not an object", `{`, `[`, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(handManifest, c.old) {
				t.Fatalf("test bug: %q not in the manifest", c.old)
			}
			in := strings.Replace(handManifest, c.old, c.new, 1)
			if c.name == "truncated" {
				in = in[:strings.Index(in, `"layers": `)+10]
			}
			_, err := ParseManifest([]byte(in))
			if !errors.Is(err, ErrManifest) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want ErrManifest mentioning %q", err, c.want)
			}
		})
	}
}

func TestParseManifestLimits(t *testing.T) {
	deep := strings.Repeat("[", 1000) + strings.Repeat("]", 1000)
	if _, err := ParseManifest([]byte(deep)); !errors.Is(err, ErrManifest) || !strings.Contains(err.Error(), "nested") {
		t.Fatalf("deep nesting: %v", err)
	}
	// More layers listed than n_layer, and more experts than n_expert.
	m, err := ParseManifest([]byte(handManifest))
	if err != nil {
		t.Fatal(err)
	}
	m.NLayer = 2
	m.Layers[0].Layer = 1
	m.Layers = append(m.Layers, m.Layers[0], m.Layers[0])
	if err := m.Validate(); !errors.Is(err, ErrManifest) {
		t.Fatalf("3 layers of 2: %v", err)
	}
	m, _ = ParseManifest([]byte(handManifest))
	m.NExpert = 1
	if err := m.Validate(); !errors.Is(err, ErrManifest) {
		t.Fatalf("2 experts of 1: %v", err)
	}
	// Open refuses an oversized manifest without reading it (a sparse file
	// of MaxManifestBytes+1 bytes).
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, ManifestName))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(MaxManifestBytes + 1); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := Open(dir); !errors.Is(err, ErrManifest) || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("oversized manifest: %v", err)
	}
}

func FuzzParseManifest(f *testing.F) {
	f.Add([]byte(handManifest))
	f.Add([]byte(handManifest[:len(handManifest)/2]))
	f.Add([]byte(strings.Replace(handManifest, `"n_expert": 8`, `"n_expert": 1099511627776`, 1)))
	f.Add([]byte(strings.Replace(handManifest, `"version": 1`, `"version": 9`, 1)))
	f.Add([]byte(strings.Replace(handManifest, `"layer": 2`, `"layer": "2"`, 1)))
	f.Add([]byte(strings.Replace(handManifest, `"version": 1,`, `"version": 1, "version": 1,`, 1)))
	f.Add([]byte(`{}`))
	f.Add([]byte(`null`))
	f.Add([]byte(strings.Repeat("[", 64)))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseManifest(data)
		if err != nil {
			if !errors.Is(err, ErrManifest) {
				t.Fatalf("error %v does not wrap ErrManifest", err)
			}
			return
		}
		// A manifest that parses is valid and survives a round trip.
		if err := m.Validate(); err != nil {
			t.Fatalf("parsed but invalid: %v", err)
		}
		b, err := m.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		m2, err := ParseManifest(b)
		if err != nil || !reflect.DeepEqual(m, m2) {
			t.Fatalf("round trip: %v", err)
		}
	})
}

func FuzzParseList(f *testing.F) {
	for _, s := range []string{"0-7,12", "all", "", "1-", "-", "3,3,3", "0-99999999999", " 1 , 2 "} {
		f.Add(s, 16)
	}
	f.Fuzz(func(t *testing.T, s string, n int) {
		n %= 1 << 12
		got, err := ParseList(s, n)
		if err != nil {
			if !errors.Is(err, ErrSelection) {
				t.Fatalf("error %v does not wrap ErrSelection", err)
			}
			return
		}
		for i, x := range got {
			if x < 0 || x >= n || (i > 0 && got[i-1] >= x) {
				t.Fatalf("ParseList(%q, %d) = %v: not ascending in range", s, n, got)
			}
		}
	})
}
