package run

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"

	"github.com/kvasir-ai/kvasir/engine/gguf"
)

// ResidentAuto is --resident's default: copy the weights into the
// process's memory (huge pages where granted) when they fit in the memory
// available (lock the mapping when the copy fails), else leave them mapped
// with a warning.
const ResidentAuto = "auto"

// AddResidentFlag registers --resident on fs.
func AddResidentFlag(fs *flag.FlagSet) *string {
	return fs.String("resident", ResidentAuto, "how the model's weights stay in memory: auto (copy them when they fit in available memory, else leave them mapped and warn), copy (into the process's own memory, on huge pages where the system grants them: never evicted, fewest page-table walks), lock (mlock the file's mapping: read once, never evicted), mmap (page cache only: evicted weights are read from disk again at each step)")
}

// CheckResident returns an error unless choice is a --resident value:
// auto, mmap, lock or copy (for a command to refuse it with its usage
// errors, before loading the model).
func CheckResident(choice string) error {
	if choice == ResidentAuto {
		return nil
	}
	if _, err := gguf.ParseResidency(choice); err != nil {
		return fmt.Errorf("--resident %q: want auto, mmap, lock or copy", choice)
	}
	return nil
}

// residentMargin is the memory auto leaves to everything else: the larger
// of 1 GiB and a tenth of the machine's memory.
func residentMargin(total uint64) uint64 { return max(1<<30, total/10) }

// Resident applies --resident to the model's weights (every tensor of the
// file: a backbone computes whatever a step routes to it) and logs what it
// did. choice is auto, lock, copy or mmap. auto reads MemAvailable and
// MemTotal from /proc/meminfo: when the weights plus residentMargin fit it
// copies them into the process's own memory, on transparent huge pages
// where the system grants them (gguf.ResidentCopied: less CPU per weight
// byte than the file's 4 KiB pages), falling back to locking the mapping
// when the copy fails; otherwise (or
// without /proc/meminfo) it leaves them mapped and warns. Errors: an
// unknown choice, or an explicit lock/copy that failed (the weights then
// stay mapped and valid).
func (m *Model) Resident(choice string, log *slog.Logger) (gguf.ResidentReport, error) {
	f := m.File()
	need := f.ResidentBytes(nil)
	if err := CheckResident(choice); err != nil {
		return gguf.ResidentReport{}, err
	}
	if choice != ResidentAuto {
		mode, _ := gguf.ParseResidency(choice)
		r, err := f.MakeResident(mode, nil)
		if err == nil {
			log.Info("weights resident", "how", r.String())
		}
		return r, err
	}
	avail, total, err := memInfoFn()
	if err != nil || need+residentMargin(total) > avail {
		if err == nil {
			log.Warn("the model's weights do not fit in available memory: left mapped; weights the page cache evicts are read from disk again at each step that needs them (decode slows down). Use a backbone-only file with --dispatch-listen, or more memory",
				"weights_gb", fmt.Sprintf("%.2f", float64(need)/1e9), "available_gb", fmt.Sprintf("%.2f", float64(avail)/1e9))
		}
		return f.MakeResident(gguf.ResidentMapped, nil)
	}
	r, err := f.MakeResident(gguf.ResidentCopied, nil)
	if err != nil {
		log.Info("copying the weights into process memory failed; locking the mapping instead", "err", err)
		if r, err = f.MakeResident(gguf.ResidentLocked, nil); err != nil {
			log.Warn("weights left mapped", "err", err)
			return f.MakeResident(gguf.ResidentMapped, nil)
		}
	}
	if r.Bytes > 0 {
		log.Info("weights resident", "how", r.String())
	}
	return r, nil
}

// memInfoFn is memInfo; tests replace it.
var memInfoFn = memInfo

// memInfo returns MemAvailable and MemTotal in bytes from /proc/meminfo.
func memInfo() (avail, total uint64, err error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var key string
		var kb uint64
		fields := bytes.Fields(sc.Bytes())
		if len(fields) < 2 {
			continue
		}
		key = string(fields[0])
		if kb, err = strconv.ParseUint(string(fields[1]), 10, 64); err != nil {
			continue
		}
		switch key {
		case "MemAvailable:":
			avail = kb << 10
		case "MemTotal:":
			total = kb << 10
		}
	}
	if avail == 0 || total == 0 {
		return 0, 0, errors.New("/proc/meminfo has no MemAvailable or MemTotal")
	}
	return avail, total, nil
}
