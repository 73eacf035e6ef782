package serve

import (
	"errors"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
)

// metrics are the server's own Prometheus series (namespace kvasir_serve).
// Rates (tokens/s) come from the counters: rate(kvasir_serve_generated_tokens_total[1m]).
type metrics struct {
	promptTokens    prometheus.Counter     // prompt tokens prefilled
	generatedTokens prometheus.Counter     // tokens sampled
	draftTokens     prometheus.Counter     // draft tokens verified (Job.Draft)
	draftAccepted   prometheus.Counter     // draft tokens accepted
	steps           prometheus.Counter     // Forward calls
	stepSeconds     prometheus.Histogram   // wall time of one step (Forward + sampling), seconds
	batchRows       prometheus.Histogram   // rows per step (prefill + decode)
	batchSeqs       prometheus.Histogram   // sequences per step
	queueDepth      prometheus.Gauge       // requests waiting for a slot
	active          prometheus.Gauge       // sequences being decoded
	finished        *prometheus.CounterVec // requests ended, by reason: stop, length, cancelled, error
	rejected        prometheus.Counter     // requests refused with 429 (queue full)
	httpRequests    *prometheus.CounterVec // HTTP requests by endpoint and status code
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "kvasir", "serve"
	pow2 := prometheus.ExponentialBuckets(1, 2, 11) // 1 .. 1024
	m := &metrics{
		promptTokens: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "prompt_tokens_total", Help: "Prompt tokens prefilled."}),
		generatedTokens: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "generated_tokens_total", Help: "Tokens sampled (completion tokens)."}),
		draftTokens: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "draft_tokens_total", Help: "Speculative draft tokens verified (requests with draft)."}),
		draftAccepted: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "draft_accepted_tokens_total", Help: "Speculative draft tokens accepted (each one token without its own forward)."}),
		steps: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "steps_total", Help: "Batched forward steps run."}),
		stepSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name: "step_seconds", Help: "Wall time of one batched step (forward pass and sampling), seconds.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		batchRows: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name: "batch_rows", Help: "Token rows (prefill and decode) per step.", Buckets: pow2}),
		batchSeqs: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name: "batch_sequences", Help: "Sequences sharing one step.", Buckets: pow2}),
		queueDepth: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "queue_depth", Help: "Requests waiting for a decoding slot."}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "active_sequences", Help: "Sequences being prefilled or decoded."}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "requests_finished_total", Help: "Generations ended, by reason (stop, length, cancelled, error)."},
			[]string{"reason"}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "requests_rejected_total", Help: "Requests refused with 429 because the queue was full."}),
		httpRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "http_requests_total", Help: "HTTP requests by endpoint and status code."}, []string{"endpoint", "code"}),
	}
	for _, c := range []prometheus.Collector{m.promptTokens, m.generatedTokens, m.draftTokens, m.draftAccepted, m.steps, m.stepSeconds, m.batchRows,
		m.batchSeqs, m.queueDepth, m.active, m.finished, m.rejected, m.httpRequests} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	// The Go runtime (go_*) and process (process_*: RSS, CPU, open fds)
	// series, unless the registry has them already.
	for _, c := range []prometheus.Collector{collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return nil, err
			}
		}
	}
	return m, nil
}

// SwarmCollector exports a dispatcher's statistics (dispatch.Stats, read at
// each scrape) as Prometheus series in namespace kvasir_swarm:
//
//	kvasir_swarm_calls_total                      ComputeExperts calls
//	kvasir_swarm_expert_outputs_total{where}      (row, slot) outputs, where = remote | local
//	kvasir_swarm_fallbacks_total                  worker requests recomputed locally
//	kvasir_swarm_worker_requests_total{worker,session}        DISPATCH frames sent
//	kvasir_swarm_worker_round_trips_total{worker,session}     RESULTs accepted
//	kvasir_swarm_worker_deadline_misses_total{worker,session} requests past their deadline
//	kvasir_swarm_worker_late_total{worker,session}            RESULTs after the deadline
//	kvasir_swarm_worker_bytes_total{worker,session,dir}       message bytes, dir = in | out
//	kvasir_swarm_worker_rtt_seconds{worker,session,quantile}  recent round trip, quantile 0.5 | 0.99
//	kvasir_swarm_worker_connected{worker,session}             1 while the session is up
//	kvasir_swarm_worker_stalled{worker,session}               1 while routed around after a missed deadline
//	kvasir_swarm_worker_holdings{worker,session}              (layer, expert) pairs accepted (grows as a provisioned worker downloads; 0 once the session ended)
//	kvasir_swarm_checks_total                     worker results verified by local recomputation (issue 11)
//	kvasir_swarm_check_mismatches_total           checked results that differed (workers caught)
//	kvasir_swarm_check_seconds_total              local compute time spent on the references
//	kvasir_swarm_banned_refusals_total            HELLOs refused because the key is banned
//	kvasir_swarm_banned_workers                   keys banned now
//	kvasir_swarm_failovers_total                  replica requests sent for a failed request's pairs
//	kvasir_swarm_cross_checks_total               requests verified by replica comparison (issue 12)
//	kvasir_swarm_disputes_total                   replica comparisons that differed (a third holder decides)
//	kvasir_swarm_unverified_outputs_total         outputs chosen for a check nothing could check
//	kvasir_swarm_holder_waits_total               steps that waited for a worker holding an expert
//	kvasir_swarm_holder_wait_seconds_total        time steps spent waiting for holders
//	kvasir_swarm_no_holder_failures_total         steps failed after the wait (HTTP 503)
//	kvasir_swarm_plan_uncovered_experts           experts the assignment could not place (quotas too small)
//	kvasir_swarm_verify_info{policy}              1 for the verification policy (--verify): spot | quorum (issue 20)
//	kvasir_swarm_quorum_requests_total{outcome}   quorum requests: sent (to two holders), agreed, local (decided by the backbone), disputed
//	kvasir_swarm_quorum_asks_total                further opinions asked (a missing or disputed answer, no local copy)
//	kvasir_swarm_digests_total                    DIGEST answers received
//	kvasir_swarm_sum_requests_total               DISPATCH_SUMs sent (rows answered with their weighted sum, wire 6)
//	kvasir_swarm_sum_rows_total                   rows in them
//
// worker is the first 16 hex digits of the worker's public key. Sessions
// that ended stay (the dispatcher keeps up to 256) so their counters do not
// go backwards.
type SwarmCollector struct {
	stats                                          func() dispatch.Stats
	calls, outputs, fallbacks                      *prometheus.Desc
	wRequests, wRoundTrips, wMisses, wLate, wBytes *prometheus.Desc
	wRTT, wConnected, wHoldings, wStalled          *prometheus.Desc
	wPart, wake                                    *prometheus.Desc
	checks, mismatches, checkSecs, refusedBanned   *prometheus.Desc
	banned, failovers                              *prometheus.Desc
	crossChecks, disputes, unverified              *prometheus.Desc
	holderWaits, holderWaitSecs, noHolder, planUnc *prometheus.Desc
	verify, quorum, quorumAsks, digests            *prometheus.Desc
	sumRequests, sumRows                           *prometheus.Desc
	spinThreads, spinSecs                          *prometheus.Desc
}

var _ prometheus.Collector = (*SwarmCollector)(nil)

// NewSwarmCollector returns a collector over stats (typically
// (*dispatch.Dispatcher).Stats); register it on the server's registry
// (Config.Registry).
func NewSwarmCollector(stats func() dispatch.Stats) *SwarmCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("kvasir_swarm_"+name, help, labels, nil)
	}
	wl := []string{"worker", "session"}
	return &SwarmCollector{stats: stats,
		calls:       d("calls_total", "Expert computations requested by the backbone (one per MoE layer and step)."),
		outputs:     d("expert_outputs_total", "Expert (row, slot) outputs used, by where they were computed.", "where"),
		fallbacks:   d("fallbacks_total", "Worker requests whose outputs were recomputed locally (late, failed or refused)."),
		wRequests:   d("worker_requests_total", "DISPATCH frames sent to the worker.", wl...),
		wRoundTrips: d("worker_round_trips_total", "Round trips completed: RESULTs accepted from the worker.", wl...),
		wMisses:     d("worker_deadline_misses_total", "Requests to the worker that passed their deadline.", wl...),
		wLate:       d("worker_late_total", "RESULTs that arrived after their deadline and were dropped.", wl...),
		wBytes:      d("worker_bytes_total", "Message bytes exchanged with the worker (in: from it, out: to it).", append(wl, "dir")...),
		wRTT:        d("worker_rtt_seconds", "Recent round trip to the worker, seconds.", append(wl, "quantile")...),
		wPart: d("worker_request_part_seconds", "Median time of recent requests spent in each part (encode, write, queue, compute, wire, decode: issue 19), seconds.",
			append(wl, "part")...),
		wake:           d("answer_wake_seconds", "Median time from an answer read on a worker's link to its call using it, seconds."),
		wConnected:     d("worker_connected", "1 while the worker session is connected, 0 after it ended.", wl...),
		wStalled:       d("worker_stalled", "1 while the worker is routed around: it missed a deadline and has sent nothing since.", wl...),
		wHoldings:      d("worker_holdings", "(layer, expert) pairs of the worker accepted by the dispatcher (hash checked).", wl...),
		checks:         d("checks_total", "Worker results verified against a local recomputation."),
		mismatches:     d("check_mismatches_total", "Checked worker results that differed: replaced, forfeited, key banned."),
		checkSecs:      d("check_seconds_total", "Local compute time spent on verification references, seconds."),
		refusedBanned:  d("banned_refusals_total", "Worker HELLOs refused because the key is banned."),
		banned:         d("banned_workers", "Worker keys banned now."),
		failovers:      d("failovers_total", "Replica requests sent for the pairs of a failed worker request."),
		crossChecks:    d("cross_checks_total", "Worker requests verified by replica comparison (sent to two holders)."),
		disputes:       d("disputes_total", "Replica comparisons whose outputs differed (a third holder decides)."),
		unverified:     d("unverified_outputs_total", "Expert outputs chosen for a check that nothing could check (no local copy, no second holder)."),
		holderWaits:    d("holder_waits_total", "Expert calls that waited for a worker holding an expert the backbone cannot compute."),
		holderWaitSecs: d("holder_wait_seconds_total", "Time expert calls spent waiting for holders, seconds."),
		noHolder:       d("no_holder_failures_total", "Expert calls failed because no worker held an expert within the holder wait."),
		planUnc:        d("plan_uncovered_experts", "Experts the last assignment could not give to any worker (the quotas are too small)."),
		verify:         d("verify_info", "1 for the verification policy in use (--verify).", "policy"),
		quorum:         d("quorum_requests_total", "Quorum requests, by outcome: sent (to two holders), agreed (two opinions agreed), local (decided by the backbone's computation), disputed (opinions differed).", "outcome"),
		quorumAsks:     d("quorum_asks_total", "Further opinions asked under quorum (a missing or disputed answer the backbone cannot compute)."),
		digests:        d("digests_total", "DIGEST answers received (quorum)."),
		sumRequests:    d("sum_requests_total", "DISPATCH_SUMs sent: rows to a worker holding all their experts, answered with each row's weighted sum."),
		sumRows:        d("sum_rows_total", "Rows in DISPATCH_SUMs sent."),
		spinThreads:    d("spin_threads", "Threads keeping the CPUs spinning while calls wait for workers (--spin-wait; 0: off)."),
		spinSecs:       d("spin_cpu_seconds_total", "CPU time of those threads (SCHED_IDLE: time no other thread wanted), seconds."),
	}
}

// Describe implements prometheus.Collector.
func (c *SwarmCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.calls, c.outputs, c.fallbacks, c.wRequests, c.wRoundTrips, c.wMisses,
		c.wLate, c.wBytes, c.wRTT, c.wPart, c.wake, c.wConnected, c.wStalled, c.wHoldings, c.checks, c.mismatches, c.checkSecs, c.refusedBanned,
		c.banned, c.failovers, c.crossChecks, c.disputes, c.unverified, c.holderWaits, c.holderWaitSecs, c.noHolder, c.planUnc,
		c.verify, c.quorum, c.quorumAsks, c.digests, c.sumRequests, c.sumRows, c.spinThreads, c.spinSecs} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *SwarmCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	emit := func(d *prometheus.Desc, t prometheus.ValueType, v float64, l ...string) {
		// NewConstMetric fails only on label values that are not valid
		// UTF-8 (a session id is not ours to trust): skip those series.
		if m, err := prometheus.NewConstMetric(d, t, v, l...); err == nil {
			ch <- m
		}
	}
	cv := func(d *prometheus.Desc, v uint64, l ...string) { emit(d, prometheus.CounterValue, float64(v), l...) }
	cv(c.calls, st.Calls)
	emit(c.wake, prometheus.GaugeValue, st.WakeP50ms/1e3)
	cv(c.outputs, st.ExpertsRemote, "remote")
	cv(c.outputs, st.ExpertsLocal, "local")
	cv(c.fallbacks, st.Fallbacks)
	cv(c.checks, st.Checks)
	cv(c.mismatches, st.Mismatches)
	emit(c.checkSecs, prometheus.CounterValue, st.CheckTime.Seconds())
	cv(c.refusedBanned, st.RefusedBanned)
	emit(c.banned, prometheus.GaugeValue, float64(st.Banned))
	cv(c.failovers, st.Failovers)
	cv(c.crossChecks, st.CrossChecks)
	cv(c.disputes, st.Disputes)
	cv(c.unverified, st.Unverified)
	cv(c.holderWaits, st.HolderWaits)
	emit(c.holderWaitSecs, prometheus.CounterValue, st.HolderWaitTime.Seconds())
	cv(c.noHolder, st.NoHolderFailures)
	emit(c.planUnc, prometheus.GaugeValue, float64(st.PlanUncovered))
	if st.Verify != "" {
		emit(c.verify, prometheus.GaugeValue, 1, string(st.Verify))
	}
	cv(c.quorum, st.QuorumRequests, "sent")
	cv(c.quorum, st.QuorumAgreed, "agreed")
	cv(c.quorum, st.QuorumLocal, "local")
	cv(c.quorum, st.QuorumDisputes, "disputed")
	cv(c.quorumAsks, st.QuorumAsks)
	cv(c.digests, st.Digests)
	cv(c.sumRequests, st.SumRequests)
	emit(c.spinThreads, prometheus.GaugeValue, float64(st.SpinThreads))
	emit(c.spinSecs, prometheus.CounterValue, st.SpinCPU.Seconds())
	cv(c.sumRows, st.SumRows)
	seen := map[[2]string]bool{}
	for _, w := range st.Workers {
		id := w.ID
		if len(id) > 16 {
			id = id[:16]
		}
		key := [2]string{id, w.Session}
		if seen[key] { // a duplicate label set would fail the whole scrape
			continue
		}
		seen[key] = true
		cv(c.wRequests, w.Requests, id, w.Session)
		cv(c.wRoundTrips, w.Results, id, w.Session)
		cv(c.wMisses, w.Timeouts, id, w.Session)
		cv(c.wLate, w.Late, id, w.Session)
		cv(c.wBytes, w.BytesIn, id, w.Session, "in")
		cv(c.wBytes, w.BytesOut, id, w.Session, "out")
		emit(c.wRTT, prometheus.GaugeValue, w.RTTp50ms/1e3, id, w.Session, "0.5")
		emit(c.wRTT, prometheus.GaugeValue, w.RTTp99ms/1e3, id, w.Session, "0.99")
		if w.Timed > 0 {
			for _, p := range []struct {
				name string
				ms   float64
			}{{"encode", w.EncodeP50ms}, {"write", w.WriteP50ms}, {"queue", w.QueueP50ms},
				{"compute", w.ComputeP50ms}, {"wire", w.WireP50ms}, {"decode", w.DecodeP50ms}} {
				emit(c.wPart, prometheus.GaugeValue, p.ms/1e3, id, w.Session, p.name)
			}
		}
		conn := 0.0
		if w.Connected {
			conn = 1
		}
		emit(c.wConnected, prometheus.GaugeValue, conn, id, w.Session)
		stalled := 0.0
		if w.Stalled {
			stalled = 1
		}
		emit(c.wStalled, prometheus.GaugeValue, stalled, id, w.Session)
		held := float64(w.Holdings)
		if !w.Connected {
			held = 0 // an ended session holds nothing for the swarm (its last count would inflate a sum over workers)
		}
		emit(c.wHoldings, prometheus.GaugeValue, held, id, w.Session)
	}
}

// CoverageCollector exports which routed experts the swarm covers
// (dispatch.Coverage, read at each scrape):
//
//	kvasir_swarm_experts{state}              (layer, expert) pairs, state = local | held | missing
//	kvasir_swarm_expert_replicas{replicas}   pairs held by exactly that many connected workers
//	kvasir_swarm_expert_min_replicas         fewest workers holding a pair the backbone cannot compute (-1: it computes all)
//	kvasir_swarm_layer_holders{layer}         workers holding at least one expert of the layer
//	kvasir_swarm_layer_experts_held{layer}    experts of the layer held by at least one worker
//	kvasir_swarm_layer_experts_missing{layer} experts of the layer neither held nor computed by the backbone
//	kvasir_swarm_layer_min_holders{layer}     fewest workers holding any one expert of the layer (what --ready-holders asks)
//
// held counts the pairs the backbone cannot compute that at least one
// worker holds; missing the ones none holds (a step routed to one waits,
// then answers 503). Workers are connected, unpaused sessions counted by
// distinct key (dispatch.LayerCoverage); layer is the layer index the
// workers' --layers use, 0 .. layers-1, one series per layer.
type CoverageCollector struct {
	cov                         func() dispatch.Coverage
	experts, replicas, minRepls *prometheus.Desc
	lHolders, lHeld, lMissing   *prometheus.Desc
	lMin                        *prometheus.Desc
}

var _ prometheus.Collector = (*CoverageCollector)(nil)

// NewCoverageCollector returns a collector over cov (typically
// (*dispatch.Dispatcher).Coverage).
func NewCoverageCollector(cov func() dispatch.Coverage) *CoverageCollector {
	return &CoverageCollector{cov: cov,
		experts: prometheus.NewDesc("kvasir_swarm_experts", "Routed (layer, expert) pairs by where they are computed: local (the backbone), held (by a worker), missing (nowhere).",
			[]string{"state"}, nil),
		replicas: prometheus.NewDesc("kvasir_swarm_expert_replicas", "Routed (layer, expert) pairs held by exactly this many connected workers.",
			[]string{"replicas"}, nil),
		minRepls: prometheus.NewDesc("kvasir_swarm_expert_min_replicas", "Fewest connected workers holding a pair the backbone cannot compute (-1: it computes every pair).",
			nil, nil),
		lHolders: prometheus.NewDesc("kvasir_swarm_layer_holders", "Connected workers (distinct keys) holding at least one expert of the layer.",
			[]string{"layer"}, nil),
		lHeld: prometheus.NewDesc("kvasir_swarm_layer_experts_held", "Experts of the layer held by at least one connected worker.",
			[]string{"layer"}, nil),
		lMissing: prometheus.NewDesc("kvasir_swarm_layer_experts_missing", "Experts of the layer no connected worker holds and the backbone cannot compute.",
			[]string{"layer"}, nil),
		lMin: prometheus.NewDesc("kvasir_swarm_layer_min_holders", "Fewest connected workers holding any one expert of the layer (local experts included; /readyz compares it with --ready-holders).",
			[]string{"layer"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *CoverageCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.experts
	ch <- c.replicas
	ch <- c.minRepls
	ch <- c.lHolders
	ch <- c.lHeld
	ch <- c.lMissing
	ch <- c.lMin
}

// Collect implements prometheus.Collector.
func (c *CoverageCollector) Collect(ch chan<- prometheus.Metric) {
	cv := c.cov()
	g := func(d *prometheus.Desc, v int, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), l...)
	}
	g(c.experts, cv.Local, "local")
	g(c.experts, cv.Covered-cv.Local, "held")
	g(c.experts, cv.Missing, "missing")
	for n, v := range cv.ByReplicas {
		g(c.replicas, v, strconv.Itoa(n))
	}
	g(c.minRepls, cv.MinReplicas)
	for l, lc := range cv.Layers {
		layer := strconv.Itoa(l)
		g(c.lHolders, lc.Holders, layer)
		g(c.lHeld, lc.Held, layer)
		g(c.lMissing, lc.Missing, layer)
		g(c.lMin, lc.MinHolders, layer)
	}
}
