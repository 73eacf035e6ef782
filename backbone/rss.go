package main

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// processRSS returns this process's resident set size and its peak, bytes
// (VmRSS and VmHWM of /proc/self/status: anonymous memory plus the pages of
// mapped files, such as the model, that are resident). Both are 0 where
// /proc is not available.
func processRSS() (rss, peak int64) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			continue
		}
		if k == "VmRSS" {
			rss = n << 10
		} else {
			peak = n << 10
		}
	}
	return rss, peak
}
