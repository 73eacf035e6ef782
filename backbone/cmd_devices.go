package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/kvasir-ai/kvasir/engine/vulkan"
)

func init() {
	register("devices", "list the Vulkan devices a worker can compute on (--backend vulkan:N)", runDevices)
}

// runDevices: backbone devices — one line per Vulkan device. It takes no
// arguments (2 and the usage for any).
func runDevices(args []string) int {
	fs := flag.NewFlagSet("devices", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	fs.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: backbone devices\n\nLists the Vulkan devices a worker can compute on: give one to `backbone worker --backend vulkan:N`.")
	}
	if err := fs.Parse(args); err != nil {
		return parseExit(err)
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(os.Stderr, "devices: unexpected arguments %q\n", fs.Args())
		fs.Usage()
		return 2
	}
	devs, err := vulkan.Devices()
	if err != nil {
		fmt.Fprintln(os.Stderr, "devices:", err)
		return 1
	}
	if len(devs) == 0 {
		fmt.Println("no Vulkan devices")
	}
	for _, d := range devs {
		fmt.Println(d)
	}
	return 0
}
