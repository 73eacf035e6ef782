//go:build linux || freebsd || openbsd || netbsd || dragonfly

package autostart

import (
	"encoding/xml"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestXDGEnableDisable writes the entry under $XDG_CONFIG_HOME/autostart
// and removes it again.
func TestXDGEnableDisable(t *testing.T) {
	cfg := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", cfg)
	want := filepath.Join(cfg, "autostart", "ai.kvasir.contributor.desktop")
	if p, err := Path(); err != nil || p != want {
		t.Fatalf("Path %q %v, want %q", p, err, want)
	}
	if on, err := Enabled(); on || err != nil {
		t.Fatalf("enabled before Enable: %v %v", on, err)
	}
	if err := Enable("/opt/kvasir app/kvasir", "--data", "/home/a b/k"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(want)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{"[Desktop Entry]", "Type=Application", `Exec="/opt/kvasir app/kvasir" --data "/home/a b/k"`,
		"X-GNOME-Autostart-enabled=true"} {
		if !strings.Contains(string(b), l+"\n") {
			t.Errorf("entry lacks %q:\n%s", l, b)
		}
	}
	if on, err := Enabled(); !on || err != nil {
		t.Fatalf("enabled after Enable: %v %v", on, err)
	}
	if err := Set(false, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(want); !os.IsNotExist(err) {
		t.Fatalf("entry still there: %v", err)
	}
	if err := Disable(); err != nil {
		t.Fatalf("Disable twice: %v", err)
	}
}

func TestDesktopQuote(t *testing.T) {
	for in, want := range map[string]string{"/usr/bin/kvasir": "/usr/bin/kvasir", "a b": `"a b"`, `a"b`: `"a\\"b"`,
		"$HOME": `"\\$HOME"`, "100%": `"100%%"`, "": `""`} {
		if got := desktopQuote(in); got != want {
			t.Errorf("desktopQuote(%q) = %s, want %s", in, got, want)
		}
	}
}

// TestLaunchAgentPlist: well-formed XML whose ProgramArguments are the
// command line, escaped.
func TestLaunchAgentPlist(t *testing.T) {
	b := LaunchAgentPlist("/Applications/kvasir.app/Contents/MacOS/kvasir", []string{"--data", "a<b&c"})
	var v struct {
		Dict struct {
			Keys    []string `xml:"key"`
			Strings []string `xml:"string"`
			Array   struct {
				Strings []string `xml:"string"`
			} `xml:"array"`
		} `xml:"dict"`
	}
	if err := xml.Unmarshal(b, &v); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	args := v.Dict.Array.Strings
	if len(args) != 3 || args[0] != "/Applications/kvasir.app/Contents/MacOS/kvasir" || args[2] != "a<b&c" ||
		v.Dict.Strings[0] != ID || !strings.Contains(string(b), "<key>RunAtLoad</key>\n\t<true/>") {
		t.Errorf("plist %+v\n%s", v, b)
	}
}
