//go:build nogui

package main

import (
	"fmt"
	"os"
	"slices"

	"github.com/kvasir-ai/kvasir/app/headless"
)

// main without the GUI: headless mode and the wallet command only.
func main() {
	args := os.Args[1:]
	if (len(args) > 0 && args[0] == "wallet") || slices.Contains(args, "--headless") || slices.Contains(args, "-headless") {
		os.Exit(headless.Main(args, os.Stdout, os.Stderr))
	}
	fmt.Fprintln(os.Stderr, `kvasir: built without the GUI (-tags nogui). Usage:
  kvasir --headless [--gateway wss://HOST:443] [--slice DIR] [--ca FILE] [--quota SIZE]   (kvasir --headless -h: all flags;
                    with none: the public gateway, experts downloaded into the data folder within 4 GB)
  kvasir wallet [--json] [--by hour|day|session]                                          (the local wallet)`)
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		return
	}
	os.Exit(2)
}
