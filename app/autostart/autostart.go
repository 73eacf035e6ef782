// Package autostart starts the contributor app when the owner logs in:
// an XDG autostart entry on Linux and the BSDs
// ($XDG_CONFIG_HOME/autostart/ai.kvasir.contributor.desktop, the
// freedesktop.org Desktop Application Autostart Specification), a
// LaunchAgent on macOS (~/Library/LaunchAgents/ai.kvasir.contributor.plist,
// loaded by launchd at login). The file formats are built here for every
// platform (and tested on any); which one Enable writes is chosen by build
// tags. Other platforms get ErrUnsupported. It does not import Fyne.
package autostart

import (
	"bytes"
	"encoding/xml"
	"errors"
	"os"
	"path/filepath"
	"strings"
)

// ID names the autostart entry (the app's ID, as in FyneApp.toml).
const ID = "ai.kvasir.contributor"

// ErrUnsupported: this platform has no autostart mechanism here.
var ErrUnsupported = errors.New("autostart: not supported on this platform")

// Enable makes the app start at login as exe with args, replacing an
// entry written before (so a moved binary is followed).
func Enable(exe string, args ...string) error {
	p, err := Path()
	if err != nil {
		return err
	}
	data, err := entry(exe, args)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// Disable removes the entry; no entry is not an error.
func Disable() error {
	p, err := Path()
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Enabled reports whether the entry exists.
func Enabled() (bool, error) {
	p, err := Path()
	if err != nil {
		return false, err
	}
	_, err = os.Stat(p)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// Set enables (with exe and args) or disables the entry.
func Set(on bool, exe string, args ...string) error {
	if on {
		return Enable(exe, args...)
	}
	return Disable()
}

// DesktopEntry is the XDG autostart file for exe with args: Exec quotes
// each argument as the Desktop Entry Specification requires (double
// quotes around any argument with a reserved character; \", \`, \$ and
// \\ inside).
func DesktopEntry(exe string, args []string) []byte {
	var exec []string
	for _, a := range append([]string{exe}, args...) {
		exec = append(exec, desktopQuote(a))
	}
	return []byte("[Desktop Entry]\n" +
		"Type=Application\n" +
		"Name=kvasir contributor\n" +
		"Comment=Computes experts for the kvasir network and earns KVR\n" +
		"Exec=" + strings.Join(exec, " ") + "\n" +
		"Icon=" + ID + "\n" +
		"Terminal=false\n" +
		"X-GNOME-Autostart-enabled=true\n")
}

func desktopQuote(a string) string {
	if a != "" && !strings.ContainsAny(a, " \t\n\"'\\><~|&;$*?#()`=%") {
		return a
	}
	r := strings.NewReplacer(`\`, `\\\\`, `"`, `\\"`, "`", "\\\\`", `$`, `\\$`, "%", "%%")
	return `"` + r.Replace(a) + `"`
}

// LaunchAgentPlist is the macOS LaunchAgent for exe with args: started at
// login (RunAtLoad), not restarted when it quits (the owner may quit it).
func LaunchAgentPlist(exe string, args []string) []byte {
	var b bytes.Buffer
	esc := func(s string) string {
		var e bytes.Buffer
		_ = xml.EscapeText(&e, []byte(s))
		return e.String()
	}
	b.WriteString(`<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0">
<dict>
	<key>Label</key>
	<string>` + ID + `</string>
	<key>ProgramArguments</key>
	<array>
`)
	for _, a := range append([]string{exe}, args...) {
		b.WriteString("\t\t<string>" + esc(a) + "</string>\n")
	}
	b.WriteString(`	</array>
	<key>RunAtLoad</key>
	<true/>
	<key>KeepAlive</key>
	<false/>
	<key>ProcessType</key>
	<string>Background</string>
</dict>
</plist>
`)
	return b.Bytes()
}
