package run

import (
	"fmt"

	"github.com/kvasir-ai/kvasir/engine/bytesize"
)

// ParseBytes parses a byte count (engine/bytesize.Parse: KiB, MiB, GiB,
// TiB or KB, MB, GB, TB, decimals allowed, e.g. "64MiB", "4GB"): the form
// of the commands' --quota, --chunk-size, --provision-rate and
// --max-state-memory flags, as the contributor app's --quota.
func ParseBytes(s string) (int64, error) {
	v, err := bytesize.Parse(s)
	if err != nil {
		return 0, fmt.Errorf("bad byte count %q (want e.g. 512MiB or 4GB)", s)
	}
	return v, nil
}
