//go:build !nogui

package main

import (
	"bytes"
	"os"
	"testing"

	"github.com/BurntSushi/toml"

	"github.com/kvasir-ai/kvasir/app"
	"github.com/kvasir-ai/kvasir/assets"
)

// TestFyneAppMetadata holds FyneApp.toml (read by `fyne package`) to the
// app's constants: the same app ID as the Preferences store, and the
// embedded icon.
func TestFyneAppMetadata(t *testing.T) {
	var meta struct {
		Details struct {
			Icon    string
			Name    string
			ID      string
			Version string
			Build   int
		}
	}
	md, err := toml.DecodeFile("FyneApp.toml", &meta)
	if err != nil {
		t.Fatal(err)
	}
	if u := md.Undecoded(); len(u) > 0 {
		t.Logf("keys not checked here: %v", u)
	}
	d := meta.Details
	if d.ID != app.AppID || d.Name != "kvasir" || d.Version == "" || d.Build < 1 {
		t.Errorf("FyneApp.toml Details %+v, want ID %s", d, app.AppID)
	}
	icon, err := os.ReadFile(d.Icon)
	if err != nil || !bytes.Equal(icon, assets.Icon) {
		t.Errorf("icon %s: %v (equal to assets.Icon: %v)", d.Icon, err, bytes.Equal(icon, assets.Icon))
	}
}
