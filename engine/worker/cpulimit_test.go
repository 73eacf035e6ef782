package worker

import (
	"crypto/ed25519"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

const ms = time.Millisecond

// TestRestAfter: worked examples of the rest that keeps the average at the
// limit, r = cpu / (pct/100 x cores) - wall, by hand.
func TestRestAfter(t *testing.T) {
	cases := []struct {
		name             string
		cpu, wall        time.Duration
		pct, cores       int
		want             time.Duration
		avgCores, avgPct float64 // what the process averages over wall + rest
	}{
		// 4 threads busy for 100 ms on 4 cores = 400 ms CPU. At 50 % the
		// share is 2 CPU s per s: 400 ms of CPU is 200 ms of share, so
		// rest 100 ms = c x (100/50 - 1).
		{"all cores, 50%", 400 * ms, 100 * ms, 50, 4, 100 * ms, 2, 50},
		// At 25 %: 400 ms / 1 core-per-s = 400 ms, rest 300 ms = c x (100/25 - 1).
		{"all cores, 25%", 400 * ms, 100 * ms, 25, 4, 300 * ms, 1, 25},
		// 1 thread of 4 cores is 25 % of the machine: under 50 % no rest.
		{"one thread of four, 50%", 100 * ms, 100 * ms, 50, 4, 0, 1, 25},
		// 2 threads of 4 cores (200 ms CPU) at 25 %: 200 ms / 1 = 200 ms,
		// rest 100 ms; 200 ms CPU over 200 ms is one core = 25 %.
		{"two threads of four, 25%", 200 * ms, 100 * ms, 25, 4, 100 * ms, 1, 25},
		// 10 % of 2 cores is 0.2 CPU s per s: 2 threads x 30 ms = 60 ms
		// of CPU is 300 ms of share: rest 270 ms = 30 x (100/10 - 1).
		{"2 cores, 10%", 60 * ms, 30 * ms, 10, 2, 270 * ms, 0.2, 10},
		// 1 % of one core: 5 ms of CPU buys 500 ms: rest 495 ms.
		{"1 core, 1%", 5 * ms, 5 * ms, 1, 1, 495 * ms, 0.01, 1},
		{"no limit", 400 * ms, 100 * ms, 100, 4, 0, 4, 100},
		{"no limit (0)", 400 * ms, 100 * ms, 0, 4, 0, 4, 100},
	}
	for _, c := range cases {
		got := restAfter(c.cpu, c.wall, c.pct, c.cores)
		if got != c.want {
			t.Errorf("%s: rest %v, want %v", c.name, got, c.want)
		}
		avg := c.cpu.Seconds() / (c.wall + got).Seconds()
		if math.Abs(avg-c.avgCores) > 1e-9 || math.Abs(100*avg/float64(c.cores)-c.avgPct) > 1e-6 {
			t.Errorf("%s: average %.4f cores (%.2f %%), want %.4f (%.2f %%)", c.name, avg, 100*avg/float64(c.cores), c.avgCores, c.avgPct)
		}
	}
}

// TestDutyCycleWorked follows the debt by hand on 2 cores at 50 % (a
// share of 1 CPU s per s; a rest starts at 0.5 CPU s of debt).
func TestDutyCycleWorked(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var d dutyCycle
	if d.on() || d.due() || d.rest() != 0 {
		t.Fatal("the zero value limits")
	}
	d.set(50, 2, t0, 10*time.Second) // the process has used 10 s before: not owed
	step := func(at, cpu time.Duration, debt float64, due bool, rest time.Duration) {
		t.Helper()
		d.observe(t0.Add(at), 10*time.Second+cpu)
		if math.Abs(d.debt-debt) > 1e-9 || d.due() != due || d.rest() != rest {
			t.Fatalf("at %v cpu %v: debt %.4f due %v rest %v, want %.4f %v %v", at, cpu, d.debt, d.due(), d.rest(), debt, due, rest)
		}
	}
	// Both cores busy: 200 ms CPU in 100 ms, 100 ms of it paid back.
	step(100*ms, 200*ms, 0.1, false, 100*ms)
	step(400*ms, 800*ms, 0.4, false, 400*ms)
	// 1 s of CPU in 500 ms: 0.5 s owed, rest 500 ms (= MinRest), the
	// closed form's rest for that work taken as one request.
	step(500*ms, 1000*ms, 0.5, true, 500*ms)
	if r := restAfter(1000*ms, 500*ms, 50, 2); r != d.rest() {
		t.Fatalf("restAfter %v, the debt's rest %v", r, d.rest())
	}
	// The rest: the process used 10 ms meanwhile, so 10 ms more.
	step(1000*ms, 1010*ms, 0.01, false, 10*ms)
	if !d.owed() {
		t.Fatal("10 ms of debt is still owed")
	}
	step(1010*ms, 1010*ms, 0, false, 0)
	// Idle 9 s: the debt stays at 0, nothing is banked.
	step(10*time.Second, 1020*ms, 0, false, 0)
	// So a burst right after (1 s of CPU in 500 ms) owes as much as before.
	step(10500*ms, 2020*ms, 0.5, true, 500*ms)
	// A lower limit keeps the debt: at 25 % of 2 cores (0.5 CPU s per s)
	// 0.5 s take 1 s to pay back.
	d.set(25, 2, t0.Add(10500*ms), 10*time.Second+2020*ms)
	if d.debt != 0.5 || d.rest() != time.Second || !d.due() {
		t.Fatalf("25%%: debt %v rest %v", d.debt, d.rest())
	}
	// No limit clears it; a new limit starts with none.
	d.set(100, 2, t0, 0)
	if d.on() || d.debt != 0 || d.due() {
		t.Fatalf("100%%: %+v", d)
	}
	d.set(50, 2, t0.Add(11*time.Second), 10*time.Second+2020*ms)
	step(11100*ms, 2120*ms, 0, false, 0)
	// A clock or counter going backwards charges nothing.
	step(11000*ms, 2000*ms, 0, false, 0)
}

// TestDutyCycleSimulated drives the accounting as the worker does (work at
// full speed until a rest is due, rest debt/rate, check again) with random
// request sizes and idle gaps on a simulated clock, and checks the
// guarantee on every window: the CPU time used in any L seconds is at most
// rate x (L + MinRest) + one request's CPU time, and over the whole run
// the average is at the limit (not far below: it works when it may).
func TestDutyCycleSimulated(t *testing.T) {
	for _, c := range []struct{ pct, cores, threads int }{{50, 2, 2}, {25, 2, 2}, {10, 8, 8}, {75, 4, 4}, {30, 4, 1}} {
		rng := rand.New(rand.NewPCG(uint64(c.pct), uint64(c.cores)))
		var d dutyCycle
		now, cpu := time.Unix(0, 0), time.Duration(0)
		d.set(c.pct, c.cores, now, cpu)
		type mark struct {
			at  time.Time
			cpu time.Duration
		}
		marks := []mark{{now, cpu}}
		maxReq, gaps := time.Duration(0), time.Duration(0)
		const overhead = 0.002 // the process uses 2 ms of CPU per s while resting
		end := now.Add(60 * time.Second)
		for now.Before(end) {
			if rng.IntN(100) == 0 { // an idle gap
				gap := time.Duration(rng.IntN(2000)) * ms
				gaps += gap
				now, cpu = now.Add(gap), cpu+time.Duration(overhead*float64(gap))
				d.observe(now, cpu)
				marks = append(marks, mark{now, cpu})
			}
			wall := time.Duration(1+rng.IntN(40)) * ms
			used := wall * time.Duration(c.threads)
			maxReq = max(maxReq, used)
			d.observe(now, cpu)
			now, cpu = now.Add(wall), cpu+used
			d.observe(now, cpu)
			marks = append(marks, mark{now, cpu})
			if !d.due() {
				continue
			}
			r := d.rest()
			if r < MinRest {
				t.Fatalf("%+v: a rest of %v is shorter than MinRest", c, r)
			}
			for { // rest until paid (the overhead adds a little each time)
				now, cpu = now.Add(r), cpu+time.Duration(overhead*float64(r))
				d.observe(now, cpu)
				marks = append(marks, mark{now, cpu})
				if !d.owed() {
					break
				}
				r = d.rest()
			}
		}
		rate := float64(c.pct) / 100 * float64(c.cores)
		worst := 0.0
		for i := range marks {
			for j := i + 1; j < len(marks); j++ {
				L := marks[j].at.Sub(marks[i].at).Seconds()
				if L < 1 {
					continue
				}
				used := (marks[j].cpu - marks[i].cpu).Seconds()
				bound := rate*(L+MinRest.Seconds()) + maxReq.Seconds() + 1e-9
				if used > bound {
					t.Fatalf("%+v: %.3f CPU s in %.3f s, bound %.3f", c, used, L, bound)
				}
				worst = max(worst, (used-rate*L)/rate)
			}
		}
		total := marks[len(marks)-1]
		span := total.at.Sub(marks[0].at)
		avg := 100 * total.cpu.Seconds() / span.Seconds() / float64(c.cores)
		// Outside the idle gaps the worker had work all the time: it used
		// at least its share, or all its threads could use when that is
		// less (more right after a gap: a gap pays its debt back).
		active := 100 * total.cpu.Seconds() / (span - gaps).Seconds() / float64(c.cores)
		want := math.Min(float64(c.pct), 100*float64(c.threads)/float64(c.cores))
		t.Logf("%d%% of %d cores, %d threads: average %.2f%% (%.2f%% outside idle gaps, want %.0f%%), worst window excess %.3f s of share",
			c.pct, c.cores, c.threads, avg, active, want, worst)
		if avg > float64(c.pct)+0.5 || active < want-1 {
			t.Errorf("%+v: average %.2f%%, %.2f%% outside idle gaps; want at most %d%%, at least %.0f%% outside the gaps", c, avg, active, c.pct, want)
		}
	}
}

// TestCPULimitValidated: New and SetCPULimit refuse a limit outside 0..100
// with ErrCPULimit; Stats reports the limit in force (100 as none).
func TestCPULimitValidated(t *testing.T) {
	_, key, _ := ed25519.GenerateKey(nil)
	for _, p := range []int{-1, 101, 1000} {
		if _, err := New(Config{GatewayURL: "ws://127.0.0.1:1", Key: key, Computer: scale{4}, CPULimit: p}); !errors.Is(err, ErrCPULimit) {
			t.Errorf("CPULimit %d: %v", p, err)
		}
	}
	w, err := New(Config{GatewayURL: "ws://127.0.0.1:1", Key: key, Computer: scale{4}, CPULimit: 40})
	if err != nil {
		t.Fatal(err)
	}
	if got := w.Stats().CPULimit; got != 40 {
		t.Errorf("CPULimit %d, want 40", got)
	}
	if err := w.SetCPULimit(101); !errors.Is(err, ErrCPULimit) || w.Stats().CPULimit != 40 {
		t.Errorf("SetCPULimit(101): %v, limit %d", err, w.Stats().CPULimit)
	}
	for _, c := range []struct{ set, want int }{{100, 0}, {0, 0}, {1, 1}, {99, 99}} {
		if err := w.SetCPULimit(c.set); err != nil || w.Stats().CPULimit != c.want {
			t.Errorf("SetCPULimit(%d): %v, limit %d, want %d", c.set, err, w.Stats().CPULimit, c.want)
		}
	}
}
