package run

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseBytes parses a byte count with an optional KiB, MiB or GiB suffix
// (powers of 1024), e.g. "64MiB": the form of the commands' --quota,
// --chunk-size, --provision-rate and --max-state-memory flags.
func ParseBytes(s string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		suf string
		m   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if strings.HasSuffix(s, u.suf) {
			s, mult = strings.TrimSuffix(s, u.suf), u.m
			break
		}
	}
	v, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || v < 0 || v > (1<<62)/mult {
		return 0, fmt.Errorf("bad byte count %q", s)
	}
	return v * mult, nil
}
