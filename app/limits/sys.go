package limits

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// maxSysFile bounds what SysProbe reads from one /sys or /proc file.
const maxSysFile = 64 << 10

// SysProbe reads Linux's /sys/class/power_supply, /sys/class/thermal,
// /proc/stat and /proc/self/stat under Root ("" means "/"; tests point it
// at a fake tree). On other OSes the files are missing and every method
// returns ErrUnsupported.
type SysProbe struct {
	Root string
}

func (p SysProbe) path(rel string) string {
	root := p.Root
	if root == "" {
		root = "/"
	}
	return filepath.Join(root, rel)
}

func (p SysProbe) read(rel string) (string, error) {
	f, err := os.Open(p.path(rel))
	if err != nil {
		return "", err
	}
	defer f.Close()
	buf := make([]byte, maxSysFile)
	n, _ := f.Read(buf)
	return strings.TrimSpace(string(buf[:n])), nil
}

// OnBattery implements Probe: true when some power_supply of type
// "Battery" has status "Discharging" and no "Mains" or "USB" supply is
// online. ErrUnsupported when there is no battery.
func (p SysProbe) OnBattery() (bool, error) {
	dirs, _ := filepath.Glob(p.path("sys/class/power_supply/*"))
	haveBat, discharging, mains := false, false, false
	for _, d := range dirs {
		rel, _ := filepath.Rel(p.path(""), d)
		typ, err := p.read(filepath.Join(rel, "type"))
		if err != nil {
			continue
		}
		switch typ {
		case "Battery":
			haveBat = true
			if st, _ := p.read(filepath.Join(rel, "status")); st == "Discharging" {
				discharging = true
			}
		case "Mains", "USB":
			if on, _ := p.read(filepath.Join(rel, "online")); on == "1" {
				mains = true
			}
		}
	}
	if !haveBat {
		return false, ErrUnsupported
	}
	return discharging && !mains, nil
}

// CPUTempC implements Probe: the highest thermal_zone*/temp (millidegrees
// Celsius, the kernel's sysfs thermal ABI) among zones that read a
// plausible value (-40..150 °C). ErrUnsupported when there is none.
func (p SysProbe) CPUTempC() (float64, error) {
	zones, _ := filepath.Glob(p.path("sys/class/thermal/thermal_zone*"))
	best, ok := 0.0, false
	for _, z := range zones {
		rel, _ := filepath.Rel(p.path(""), z)
		s, err := p.read(filepath.Join(rel, "temp"))
		if err != nil {
			continue
		}
		milli, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			continue
		}
		c := float64(milli) / 1000
		if c < -40 || c > 150 {
			continue
		}
		if !ok || c > best {
			best, ok = c, true
		}
	}
	if !ok {
		return 0, ErrUnsupported
	}
	return best, nil
}

// CPUTimes implements Probe from /proc/stat's "cpu" line and fields 14-15
// (utime, stime) of /proc/self/stat, all in USER_HZ ticks (proc(5)).
func (p SysProbe) CPUTimes() (total, busy, self uint64, err error) {
	st, err := p.read("proc/stat")
	if err != nil {
		return 0, 0, 0, ErrUnsupported
	}
	total, busy, err = ParseProcStat(st)
	if err != nil {
		return 0, 0, 0, err
	}
	ss, err := p.read("proc/self/stat")
	if err != nil {
		return 0, 0, 0, ErrUnsupported
	}
	self, err = ParseSelfStat(ss)
	return total, busy, self, err
}

// ParseProcStat reads the aggregate "cpu" line of /proc/stat (proc(5)):
// user nice system idle iowait irq softirq steal [guest guest_nice]. total
// is the sum of the first eight fields (guest time is already in user),
// busy is total minus idle and iowait. Errors wrap ErrParse.
func ParseProcStat(s string) (total, busy uint64, err error) {
	line, _, _ := strings.Cut(s, "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("%w: /proc/stat has no aggregate cpu line", ErrParse)
	}
	var v [8]uint64
	for i := 0; i < 8 && i+1 < len(f); i++ {
		n, err := strconv.ParseUint(f[i+1], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("%w: /proc/stat field %d: %v", ErrParse, i+1, err)
		}
		v[i] = n
	}
	for _, n := range v {
		if total+n < total {
			return 0, 0, fmt.Errorf("%w: /proc/stat counters overflow", ErrParse)
		}
		total += n
	}
	return total, total - v[3] - v[4], nil
}

// ParseSelfStat returns utime + stime (fields 14 and 15, USER_HZ ticks)
// of a /proc/PID/stat line, whose field 2 (comm, in parentheses) may hold
// spaces and parentheses. Errors wrap ErrParse.
func ParseSelfStat(s string) (uint64, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("%w: /proc/self/stat has no comm field", ErrParse)
	}
	f := bytes.Fields([]byte(s[i+1:])) // fields 3...
	if len(f) < 13 {
		return 0, fmt.Errorf("%w: /proc/self/stat has %d fields after comm, want >= 13", ErrParse, len(f))
	}
	u, err1 := strconv.ParseUint(string(f[11]), 10, 64)
	k, err2 := strconv.ParseUint(string(f[12]), 10, 64)
	if err1 != nil || err2 != nil || u+k < u {
		return 0, fmt.Errorf("%w: /proc/self/stat utime/stime %q %q", ErrParse, f[11], f[12])
	}
	return u + k, nil
}
