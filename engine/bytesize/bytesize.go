// Package bytesize parses the byte counts of the commands' flags
// (--quota, --chunk-size, --provision-rate, --max-state-memory, the
// contributor app's --quota): one parser, so that "4GB" means the same to
// `backbone worker` and to `kvasir`.
package bytesize

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ErrBad wraps Parse's errors.
var ErrBad = errors.New("bad byte count")

// Max is the largest count Parse accepts (2^62 bytes).
const Max = 1 << 62

// Parse parses a byte count: a non-negative number, integral or decimal
// ("1.5GiB"), with an optional suffix B, KiB, MiB, GiB or TiB (powers of
// 1024) or KB, MB, GB or TB (powers of 1000), space allowed before it; a
// decimal needs a suffix (a bare "1.5" is refused, not read as 1 byte). A
// decimal is rounded down to whole bytes. Errors wrap ErrBad, naming s
// (also for a count above Max).
func Parse(s string) (int64, error) {
	units := []struct {
		suf  string
		mult int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1}}
	num, mult := strings.TrimSpace(s), int64(1)
	unit := false
	for _, u := range units {
		if n, ok := strings.CutSuffix(num, u.suf); ok {
			num, mult, unit = strings.TrimSpace(n), u.mult, true
			break
		}
	}
	if !plainNumber(num) {
		return 0, fmt.Errorf("%w: %q", ErrBad, s)
	}
	if !unit && strings.Contains(num, ".") {
		// "--quota 1.5" was 1 byte: a fraction of a byte is a missing unit.
		return 0, fmt.Errorf("%w: %q: a count of bytes is whole; give a unit for a fraction (1.5GB, 1.5GiB)", ErrBad, s)
	}
	if v, err := strconv.ParseInt(num, 10, 64); err == nil {
		if v > Max/mult {
			return 0, fmt.Errorf("%w: %q", ErrBad, s)
		}
		return v * mult, nil
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f*float64(mult) > Max {
		return 0, fmt.Errorf("%w: %q", ErrBad, s)
	}
	return int64(math.Floor(f * float64(mult))), nil
}

// plainNumber reports whether s is digits with at most one '.' and at
// least one digit: no sign, exponent, hex or spaces inside.
func plainNumber(s string) bool {
	digits, dots := 0, 0
	for _, c := range s {
		switch {
		case c >= '0' && c <= '9':
			digits++
		case c == '.':
			dots++
		default:
			return false
		}
	}
	return digits > 0 && dots <= 1
}
