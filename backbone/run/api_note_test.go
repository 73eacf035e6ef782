package run

import "testing"

// TestOpenAPINote: an API without a key is warned about when it listens
// beyond this machine (a --print-config file used as a config drops the
// key: the server then started open and said nothing), not on loopback or
// with a key.
func TestOpenAPINote(t *testing.T) {
	for _, c := range []struct {
		addr, key string
		warn      bool
	}{
		{"0.0.0.0:8080", "", true}, {":8080", "", true}, {"10.0.0.5:8080", "", true}, {"[::]:8080", "", true},
		{"127.0.0.1:8080", "", false}, {"[::1]:8080", "", false}, {"localhost:8080", "", false},
		{"0.0.0.0:8080", "sk-1", false},
	} {
		if got := OpenAPINote(c.addr, c.key) != ""; got != c.warn {
			t.Errorf("%s key %q: warn %v, want %v", c.addr, c.key, got, c.warn)
		}
	}
}
