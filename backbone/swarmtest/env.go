package swarmtest

import (
	"os"
	"time"
)

// BenchPoll is the dispatch.Config.Poll a benchmark's dispatcher uses:
// KVASIR_BENCH_POLL as a duration ("0": sleep at once, for a before/after
// comparison; unset or unparsable: 0, the dispatcher's default).
func BenchPoll() time.Duration {
	v := os.Getenv("KVASIR_BENCH_POLL")
	if v == "" {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0
	}
	if d == 0 {
		return -1
	}
	return d
}
