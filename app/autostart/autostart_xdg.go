//go:build linux || freebsd || openbsd || netbsd || dragonfly

package autostart

import (
	"os"
	"path/filepath"
)

// Path is the XDG autostart entry: $XDG_CONFIG_HOME/autostart/ID.desktop
// (~/.config when XDG_CONFIG_HOME is unset).
func Path() (string, error) {
	d, err := os.UserConfigDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(d, "autostart", ID+".desktop"), nil
}

func entry(exe string, args []string) ([]byte, error) { return DesktopEntry(exe, args), nil }
