//go:build !nogui

// Command kvasir is the contributor app: a desktop window with a tray icon
// that runs an expert worker for a kvasir swarm, or, with --headless, the
// same worker printing status lines (for servers and GPU boxes), or
// `kvasir wallet [--json]` to print the local wallet. Build with
// `-tags nogui` for a binary without the GUI libraries (headless and
// wallet only).
package main

import (
	"os"
	"slices"

	"github.com/kvasir-ai/kvasir/app"
	"github.com/kvasir-ai/kvasir/app/headless"
)

func main() {
	args := os.Args[1:]
	if (len(args) > 0 && args[0] == "wallet") || slices.Contains(args, "--headless") || slices.Contains(args, "-headless") {
		os.Exit(headless.Main(args, os.Stdout, os.Stderr))
	}
	os.Exit(app.Main(args, os.Stderr))
}
