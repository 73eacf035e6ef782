package main

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/vulkan"
)

// backendFlagHelp is the help text of `backbone worker --backend`.
const backendFlagHelp = "where experts are computed: auto (a GPU through Vulkan if there is one, else the CPU), cpu, vulkan or vulkan:N (device N of `backbone devices`, software drivers such as lavapipe included)"

// applyBackend puts sl's experts on the --backend device (engine/vulkan.Wrap)
// and returns the HELLO backend name: "cpu-" + GOARCH for the CPU,
// "vulkan:<device>" for a GPU (whose results the backbone checks within
// its tolerance), and a func releasing the device (call it when done).
func applyBackend(spec string, sl *workerSlice) (string, func() error, error) {
	cpu := "cpu-" + runtime.GOARCH
	local, ok := sl.Computer.(*expert.Local)
	if !ok {
		if b, err := vulkan.ParseBackend(spec); err != nil || b.Kind == "vulkan" {
			return "", nil, errors.Join(err, fmt.Errorf("--backend %s: this slice has no local experts to put on a device", spec))
		}
		return cpu, func() error { return nil }, nil
	}
	comp, name, closeDev, err := vulkan.Wrap(spec, local, 0, func(f string, a ...any) {
		fmt.Fprintf(os.Stderr, "worker: "+f+"\n", a...)
	})
	if err != nil {
		return "", nil, fmt.Errorf("--backend %s: %w", spec, err)
	}
	if name == "" {
		return cpu, closeDev, nil
	}
	sl.Computer = comp
	return name, closeDev, nil
}

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

// warnQuotaBackend says on stderr that a --quota worker (whose experts
// engine/worker keeps and reloads as they download) computes on the CPU
// whatever --backend asks.
func warnQuotaBackend(spec string) {
	if b, err := vulkan.ParseBackend(spec); err == nil && b.Kind == "vulkan" {
		fmt.Fprintf(os.Stderr, "worker: --backend %s: a --quota worker computes on the CPU (GPU serving needs --slice or --model-tiny)\n", spec)
	}
}
