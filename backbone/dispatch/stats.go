package dispatch

import (
	"time"

	"github.com/kvasir-ai/kvasir/engine/idlespin"
)

// WorkerStats describes one worker session as seen by the dispatcher.
type WorkerStats struct {
	ID             string    // hex ed25519 public key
	Session        string    // hub session id
	Connected      bool      // false for sessions that ended
	Paused         bool      // the worker said it takes no new work
	Stalled        bool      // it missed a deadline or answered an ERROR and has not answered since: routed around until its backoff passes (conn.stalled)
	Stalls         uint64    // times it was taken out of the holder index for that
	Reason         string    // why the session ended ("" while connected)
	Backend        string    // from HELLO
	Threads        int       // from HELLO
	Holdings       int       // accepted (layer, expert) holdings
	ConnectedSince time.Time //
	Requests       uint64    // DISPATCH frames sent (DISPATCH_DIGEST and DISPATCH_SUM too)
	Results        uint64    // RESULTs accepted
	Rows           uint64    // rows in accepted RESULTs' DISPATCHes
	Pairs          uint64    // (row, slot) outputs accepted (a sum's: the pairs summed in it)
	Timeouts       uint64    // requests that passed their deadline
	Late           uint64    // RESULTs that arrived after their deadline (dropped)
	NonFinite      uint64    // RESULTs refused for a NaN or ±Inf value (the session is then closed)
	BytesIn        uint64    // worker -> backbone message bytes
	BytesOut       uint64    // backbone -> worker message bytes
	RTTp50ms       float64   // median round trip of recent requests, ms
	RTTp99ms       float64   // 99th percentile round trip, ms
	DeadlineMs     float64   // current deadline of a request of 0 bytes (the latency part), ms
	// Where the recent RESULTs' time went (issue 19), medians in ms over
	// the last 128 (Timed of them): building the DISPATCH (Encode) and
	// writing it to the hub link (Write) on the backbone; the worker's
	// queue (read whole to compute start) and compute time, as its RESULT
	// reports them; Wire, the round trip less those two (network, TLS,
	// gateway, hub, the worker's decode and encode); decoding the RESULT
	// on the backbone (Decode).
	EncodeP50ms, WriteP50ms, QueueP50ms, ComputeP50ms, WireP50ms, DecodeP50ms float64
	Timed                                                                     int
	Quota                                                                     uint64  // slice disk quota the worker announced, bytes (0: not provisioned)
	Assigned                                                                  int     // experts in its current assignment
	AssignedBytes                                                             uint64  // their total size, bytes (<= Quota)
	Assigns                                                                   uint64  // ASSIGN frames sent
	ChunkReqs                                                                 uint64  // CHUNK_REQs served (queued)
	ChunkBytes                                                                uint64  // expert bytes sent in CHUNK frames
	Checks                                                                    uint64  // its results verified against a local recomputation
	Mismatches                                                                uint64  // checked results that differed (the session is then closed and the key banned)
	Probation                                                                 bool    // fewer than Config.Probation checks passed: every result is checked
	Tolerance                                                                 float64 // relative bound per output row its checks use; 0: exact bits (a CPU backend)
	Digests                                                                   uint64  // DIGESTs it answered (quorum: it was the second holder of a request)
}

// Stats is a snapshot of the dispatcher.
type Stats struct {
	Calls uint64 // ComputeExperts calls
	// WakeP50ms is the median time, in ms, from an answer read whole on a
	// session's link to its call using it (issue 19).
	WakeP50ms     float64
	ExpertsRemote uint64 // (row, slot) expert outputs computed by workers and used
	ExpertsLocal  uint64 // (row, slot) outputs computed by Fallback (unheld, failed or late)
	Fallbacks     uint64 // worker requests that failed (error, deadline, refused, session closed): their pairs went to a replica or local
	Workers       []WorkerStats

	// Verification (verify.go).
	Checks        uint64        // worker results verified against a local recomputation
	CheckPairs    uint64        // (row, slot) outputs in them
	Mismatches    uint64        // checked results that differed: replaced by the local outputs
	Caught        uint64        // sessions closed and keys banned for a mismatch or a RESULT never asked for
	RefusedBanned uint64        // HELLOs refused because the key is banned
	Banned        int           // keys banned now
	CheckTime     time.Duration // local compute time spent on references (wall time of Fallback, pro rata of pairs in shared batches)
	// Failover and frame splitting.
	Failovers    uint64 // replica requests sent for the pairs of a failed request
	ReplicaPairs uint64 // (row, slot) outputs delivered by such replica requests (included in ExpertsRemote)
	Splits       uint64 // extra requests made to keep every DISPATCH and RESULT within wire.MaxMessage
	// Hedging (Config.Hedge, hedge.go).
	Hedges    uint64 // hedged requests sent (a request later than its holder's p95, sent to a second holder)
	HedgeWins uint64 // hedged pairs decided by the hedge (the second request) answering first
	HedgeLost uint64 // answers that arrived but were not used (the other of their pair was): REJECTED
	// Row sums (sum.go, ComputeExpertsSum).
	SumRequests uint64 // DISPATCH_SUMs sent (rows to a worker holding all their experts, answered with their weighted sums)
	SumRows     uint64 // rows in them

	// Capacity (capacity.go).
	CrossChecks      uint64        // requests verified by replica comparison (sent twice)
	Disputes         uint64        // replica comparisons that differed (a third holder decides)
	Unverified       uint64        // (row, slot) outputs chosen for a check that nothing could check (no local copy, no second holder)
	HolderWaits      uint64        // calls that waited for a holder of a pair the backbone cannot compute
	HolderWaitTime   time.Duration // total time calls waited for holders
	NoHolderFailures uint64        // calls failed after HolderWait (*MissingError)
	// PlanUncovered is how many experts the last assignment could not give
	// to any worker (their quotas are too small); PlanNeedBytes the bytes of
	// every expert to place (all but hot ones) and PlanQuotaBytes the
	// provisioning workers' quotas, summed.
	PlanUncovered                 int
	PlanNeedBytes, PlanQuotaBytes int64

	// Quorum (quorum.go).
	Verify         VerifyMode // the verification policy: spot or quorum
	QuorumRequests uint64     // requests sent to two holders
	QuorumAgreed   uint64     // quorum requests decided by two agreeing opinions (outputs used)
	QuorumLocal    uint64     // quorum requests decided by the backbone's own computation (a disagreement, a missing answer, one holder)
	QuorumDisputes uint64     // quorum requests whose opinions disagreed
	QuorumAsks     uint64     // further opinions asked (a missing or disputed answer on a backbone that cannot compute the pairs)
	QuorumAudits   uint64     // quorum requests drawn (CheckRate) to have their agreed outputs compared with the backbone's
	Digests        uint64     // DIGEST answers received

	// Idle spinning (Config.SpinWait, engine/idlespin): the process's
	// spinner threads (0 when this dispatcher does not spin) and the CPU
	// time they used, all dispatchers of the process together. They run
	// at SCHED_IDLE: this is CPU time no other thread of the machine
	// wanted, counted in the process's CPU time (getrusage) all the same.
	SpinThreads int
	SpinCPU     time.Duration
}

func (c *conn) stats() WorkerStats {
	q, _ := c.quantiles(0.5, 0.99)
	c.mu.Lock()
	closed, reason := c.closed, c.reason
	c.mu.Unlock()
	quota, assigned := c.quotaNow.Load(), int(c.nassigned.Load())
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	tp, wp, nt := c.timingP50()
	return WorkerStats{ID: c.worker, Session: c.session, Connected: !closed, Paused: c.paused.Load(), Reason: reason,
		Stalled: c.stalled.Load(), Stalls: c.stalls.Load(),
		Backend: c.hello.Backend, Threads: int(c.hello.Threads), Holdings: int(c.nholds.Load()), ConnectedSince: c.since,
		Requests: c.reqsSent.Load(), Results: c.results.Load(), Rows: c.rows.Load(), Pairs: c.pairs.Load(),
		Timeouts: c.timeouts.Load(), Late: c.late.Load(), NonFinite: c.nonFinite.Load(), BytesIn: c.bytesIn.Load(), BytesOut: c.bytesOut.Load(),
		RTTp50ms: ms(q[0]), RTTp99ms: ms(q[1]), DeadlineMs: ms(c.deadline(c.d.cfg, 0)),
		Quota: quota, Assigned: assigned, AssignedBytes: c.assignedBytes.Load(), Assigns: c.assigns.Load(),
		ChunkReqs: c.chunkReqs.Load(), ChunkBytes: c.chunkBytes.Load(),
		Checks: c.checks.Load(), Mismatches: c.mismatches.Load(), Probation: c.passed.Load() < uint64(c.d.cfg.Probation),
		Tolerance: c.tol, Digests: c.digests.Load(),
		EncodeP50ms: ms(tp.encode), WriteP50ms: ms(tp.write), QueueP50ms: ms(tp.queue), ComputeP50ms: ms(tp.compute),
		WireP50ms: ms(wp), DecodeP50ms: ms(tp.decode), Timed: nt}
}

// Stats returns counters and per-worker statistics: connected sessions
// (sorted by session id) then up to 256 ended ones.
func (d *Dispatcher) Stats() Stats {
	d.mu.Lock()
	live := make([]*conn, 0, len(d.workers))
	for _, c := range d.workers {
		live = append(live, c)
	}
	gone := append([]WorkerStats(nil), d.gone...)
	d.mu.Unlock()
	st := Stats{Calls: d.calls.Load(), WakeP50ms: float64(d.wakeP50()) / 1e6, ExpertsRemote: d.remote.Load(), ExpertsLocal: d.local.Load(), Fallbacks: d.fails.Load(),
		Checks: d.checks.Load(), CheckPairs: d.checkPairs.Load(), Mismatches: d.mismatches.Load(), Caught: d.caught.Load(),
		RefusedBanned: d.refusedBanned.Load(), Banned: len(d.bans.List(time.Now())), CheckTime: time.Duration(d.checkNanos.Load()),
		Hedges: d.hedges.Load(), HedgeWins: d.hedgeWins.Load(), HedgeLost: d.hedgeLost.Load(),
		SumRequests: d.sumReqs.Load(), SumRows: d.sumRows.Load(),
		Failovers: d.failovers.Load(), ReplicaPairs: d.replicaPairs.Load(), Splits: d.splits.Load(),
		CrossChecks: d.crossChecks.Load(), Disputes: d.disputes.Load(), Unverified: d.unverified.Load(),
		HolderWaits: d.holderWaits.Load(), HolderWaitTime: time.Duration(d.holderWaitNanos.Load()), NoHolderFailures: d.noHolder.Load(),
		PlanUncovered: int(d.planUncovered.Load()), PlanNeedBytes: d.planNeed.Load(), PlanQuotaBytes: d.planQuota.Load(),
		Verify: d.cfg.Verify, QuorumRequests: d.quorumReqs.Load(), QuorumAgreed: d.quorumAgreed.Load(), QuorumLocal: d.quorumLocal.Load(),
		QuorumDisputes: d.quorumDisputes.Load(), QuorumAsks: d.quorumAsks.Load(), QuorumAudits: d.quorumAudits.Load(), Digests: d.digests.Load()}
	if d.spin {
		sp := idlespin.Read()
		st.SpinThreads, st.SpinCPU = sp.Threads, sp.CPU
	}
	for _, c := range live {
		st.Workers = append(st.Workers, c.stats())
	}
	for i := 1; i < len(st.Workers); i++ {
		for j := i; j > 0 && st.Workers[j].Session < st.Workers[j-1].Session; j-- {
			st.Workers[j], st.Workers[j-1] = st.Workers[j-1], st.Workers[j]
		}
	}
	st.Workers = append(st.Workers, gone...)
	return st
}
