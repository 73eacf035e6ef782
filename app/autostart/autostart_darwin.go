//go:build darwin

package autostart

import (
	"os"
	"path/filepath"
)

// Path is the LaunchAgent: ~/Library/LaunchAgents/ID.plist, which launchd
// loads at the owner's next login.
func Path() (string, error) {
	h, err := os.UserHomeDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(h, "Library", "LaunchAgents", ID+".plist"), nil
}

func entry(exe string, args []string) ([]byte, error) { return LaunchAgentPlist(exe, args), nil }
