package slice

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseList parses a selection of indices in [0, n) such as "0-7,12": a
// comma-separated list of indices and inclusive ranges "a-b" (a <= b), with
// optional spaces. It returns the indices in ascending order without
// repeats; "all" returns nil (meaning every index, as Cut takes it). An
// empty string, a malformed item, an index >= n or n <= 0 is an error
// wrapping ErrSelection.
func ParseList(s string, n int) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "all" {
		return nil, nil
	}
	if n <= 0 {
		return nil, fmt.Errorf("%w: nothing to select from (%d)", ErrSelection, n)
	}
	if s == "" {
		return nil, fmt.Errorf("%w: empty list", ErrSelection)
	}
	in := make([]bool, n)
	num := func(t string) (int, error) {
		t = strings.TrimSpace(t)
		v, err := strconv.Atoi(t)
		if err != nil || v < 0 || t == "" || t[0] == '+' {
			return 0, fmt.Errorf("%w: %q is not an index", ErrSelection, clipUTF8(t, 32))
		}
		if v >= n {
			return 0, fmt.Errorf("%w: %d out of range 0..%d", ErrSelection, v, n-1)
		}
		return v, nil
	}
	for _, item := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(item, "-")
		a, err := num(lo)
		if err != nil {
			return nil, err
		}
		b := a
		if isRange {
			if b, err = num(hi); err != nil {
				return nil, err
			}
			if b < a {
				return nil, fmt.Errorf("%w: range %d-%d is backwards", ErrSelection, a, b)
			}
		}
		for i := a; i <= b; i++ {
			in[i] = true
		}
	}
	var out []int
	for i, ok := range in {
		if ok {
			out = append(out, i)
		}
	}
	return out, nil
}
