package workerrole

import (
	"fmt"
	"io"
	"runtime"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/slice"
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

// openQuotaBackend opens the spec device for a --quota worker, whose
// experts engine/slice.Store hands over as they download
// (engine/vulkan.OpenBackend): the device (nil for the CPU), its HELLO
// backend name ("cpu-" + GOARCH for the CPU) and the Accelerator to give
// worker.Config (nil for the CPU, never a typed nil).
func openQuotaBackend(spec string, log io.Writer) (*vulkan.Computer, string, slice.Accelerator, error) {
	dev, name, err := vulkan.OpenBackend(spec, 0, func(f string, a ...any) {
		fmt.Fprintf(log, "worker: "+f+"\n", a...)
	})
	if err != nil {
		return nil, "", nil, fmt.Errorf("--backend %s: %w", spec, err)
	}
	if dev == nil {
		return nil, "cpu-" + runtime.GOARCH, nil, nil
	}
	return dev, name, dev, nil
}

// deviceStatus is the status line's part about the device: "" for the
// CPU, else " device_pairs=N cpu_pairs=M resident=R/E" ((row,
// expert) pairs computed on the device and by the CPU path; R of E held
// experts in device memory) and " fault=..." after a device fault.
func deviceStatus(c *vulkan.Computer) string {
	if c == nil {
		return ""
	}
	st := c.Stats()
	s := fmt.Sprintf(" device_pairs=%d cpu_pairs=%d resident=%d/%d", st.GPUPairs, st.CPUPairs, st.ResidentExperts,
		st.ResidentExperts+st.CPUExperts)
	if st.Fault != "" {
		s += fmt.Sprintf(" fault=%q", st.Fault)
	}
	return s
}
