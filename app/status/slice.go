package status

import (
	"fmt"
	"time"
)

// SliceInfo describes the expert slice a worker holds on disk.
type SliceInfo struct {
	Dir        string    // slice folder
	Layers     int       // MoE layers with at least one expert held
	Experts    int       // (layer, expert) pairs held
	Bytes      uint64    // bytes of expert tensors on disk
	QuotaBytes uint64    // the owner's disk quota; 0 = none set
	Bad        int       // experts listed but not served: missing, truncated or failing the hash check
	Verified   bool      // every served expert's SHA-256 matched the manifest at VerifiedAt
	VerifiedAt time.Time // zero if never verified
	Problem    string    // why the slice is unusable ("no slice folder set", a hash mismatch); "" if fine
}

// Summary renders s in one line for people, e.g.
//
//	96 experts in 2 layers, 12.6 MB of 67.1 MB quota, integrity verified 12:00:05
func (s SliceInfo) Summary() string {
	if s.Problem != "" {
		return s.Problem
	}
	if s.Experts == 0 && s.Bad == 0 {
		if s.QuotaBytes > 0 {
			return "no experts held yet (quota " + FormatBytes(s.QuotaBytes) + "): the backbone assigns them once connected"
		}
		return "no experts held"
	}
	plural := func(n int, one string) string {
		if n == 1 {
			return fmt.Sprintf("%d %s", n, one)
		}
		return fmt.Sprintf("%d %ss", n, one)
	}
	l := fmt.Sprintf("%s in %s, %s", plural(s.Experts, "expert"), plural(s.Layers, "layer"), FormatBytes(s.Bytes))
	if s.QuotaBytes > 0 {
		l += " of " + FormatBytes(s.QuotaBytes) + " quota"
	}
	switch {
	case s.Verified && s.Bad > 0:
		l += fmt.Sprintf(", %d experts failed the hash check and are not served (verified %s)", s.Bad, s.VerifiedAt.Local().Format("15:04:05"))
	case s.Verified:
		l += ", integrity verified " + s.VerifiedAt.Local().Format("15:04:05")
	default:
		l += ", integrity not verified"
	}
	return l
}
