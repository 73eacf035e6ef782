package workerrole

import (
	"fmt"
	"io"
	"runtime"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/vulkan"
)

// BackendFlagHelp is the help text of `backbone worker --backend`.
const BackendFlagHelp = "where experts are computed: auto (a GPU through Vulkan if there is one, else the CPU), cpu, vulkan or vulkan:N (device N as listed by backbone devices, software drivers such as lavapipe included)"

// applyBackend puts the local experts on the spec device
// (engine/vulkan.Wrap) and returns the Computer to serve, the HELLO
// backend name ("cpu-" + GOARCH for the CPU, "vulkan:<device>" for a GPU,
// whose results the backbone checks within its tolerance) and a func
// releasing the device (call it when done).
func applyBackend(spec string, local *expert.Local, log io.Writer) (expert.Computer, string, func() error, error) {
	cpu := "cpu-" + runtime.GOARCH
	comp, name, closeDev, err := vulkan.Wrap(spec, local, 0, func(f string, a ...any) {
		fmt.Fprintf(log, "worker: "+f+"\n", a...)
	})
	if err != nil {
		return nil, "", nil, fmt.Errorf("--backend %s: %w", spec, err)
	}
	if name == "" {
		return local, cpu, closeDev, nil
	}
	return comp, name, closeDev, nil
}

// warnQuotaBackend says on log that a --quota worker (whose experts
// engine/worker keeps and reloads as they download) computes on the CPU
// whatever --backend asks.
func warnQuotaBackend(spec string, log io.Writer) {
	if b, err := vulkan.ParseBackend(spec); err == nil && b.Kind == "vulkan" {
		fmt.Fprintf(log, "worker: --backend %s: a --quota worker computes on the CPU (GPU serving needs --slice or --model-tiny)\n", spec)
	}
}
