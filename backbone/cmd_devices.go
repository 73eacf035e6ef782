package main

import (
	"fmt"
	"os"

	"github.com/kvasir-ai/kvasir/engine/vulkan"
)

func init() {
	register("devices", "list the Vulkan devices a worker can compute on (--backend vulkan:N)", runDevices)
}

// runDevices: backbone devices — one line per Vulkan device.
func runDevices(args []string) int {
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
