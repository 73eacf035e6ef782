//go:build !(linux || freebsd || openbsd || netbsd || dragonfly || darwin)

package autostart

// Path returns ErrUnsupported: no autostart here yet (Windows would use
// the Run registry key or a Startup-folder shortcut).
func Path() (string, error) { return "", ErrUnsupported }

func entry(string, []string) ([]byte, error) { return nil, ErrUnsupported }
