package dispatch

import "time"

// timing is one answered request's time, split where it went (issue 19):
// on the backbone, building the DISPATCH (encode) and writing it to the
// hub link (write); the round trip from the write's start to the RESULT
// read whole on the link (rtt), of which the worker reports its queue and
// compute time (wire.Timing); decoding the RESULT on the session's reader
// (decode). The rest of the round trip is the wire's: network, TLS,
// gateway, hub and the worker's read, decode and encode.
type timing struct {
	encode, write, rtt, queue, compute, decode time.Duration
}

func (c *conn) addTiming(t timing) {
	c.mu.Lock()
	c.times[c.ntimes%len(c.times)] = t
	c.ntimes++
	c.mu.Unlock()
}

// timingP50 returns the medians of the recent RESULTs' timings, each part
// on its own (the parts' medians need not add up to the round trip's), and
// the wire's share: the median of rtt - queue - compute.
func (c *conn) timingP50() (p50 timing, wireP50 time.Duration, n int) {
	c.mu.Lock()
	ts := append([]timing(nil), c.times[:min(c.ntimes, len(c.times))]...)
	c.mu.Unlock()
	if len(ts) == 0 {
		return timing{}, 0, 0
	}
	med := func(f func(t timing) time.Duration) time.Duration {
		v := make([]int64, len(ts))
		for i, t := range ts {
			v[i] = int64(f(t))
		}
		return time.Duration(quantile(v, 0.5))
	}
	p50 = timing{encode: med(func(t timing) time.Duration { return t.encode }),
		write:   med(func(t timing) time.Duration { return t.write }),
		rtt:     med(func(t timing) time.Duration { return t.rtt }),
		queue:   med(func(t timing) time.Duration { return t.queue }),
		compute: med(func(t timing) time.Duration { return t.compute }),
		decode:  med(func(t timing) time.Duration { return t.decode })}
	return p50, med(func(t timing) time.Duration { return t.rtt - t.queue - t.compute }), len(ts)
}

// addWake records how long an answer waited, after the session's reader
// had it whole, until its call used it (delivery, the call's goroutine
// waking up, earlier answers resolved first).
func (d *Dispatcher) addWake(w time.Duration) {
	d.wmu.Lock()
	d.wakes[d.nwakes%len(d.wakes)] = int64(w)
	d.nwakes++
	d.wmu.Unlock()
}

// wakeP50 is the median of the recent answers' wake times.
func (d *Dispatcher) wakeP50() time.Duration {
	d.wmu.Lock()
	v := append([]int64(nil), d.wakes[:min(d.nwakes, len(d.wakes))]...)
	d.wmu.Unlock()
	return time.Duration(quantile(v, 0.5))
}
