package dispatch

import (
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/kvasir-ai/kvasir/engine/wire"
)

// Provisioning (issue 6): with Config.Catalog set, the dispatcher assigns
// experts to every worker that announces a disk quota in HELLO, serves the
// experts' bytes in chunks (CHUNK_REQ -> CHUNK) from the catalog's views
// into the memory-mapped GGUF at most Config.RateLimit bytes/s per worker,
// and starts routing to an expert as soon as the worker announces it in
// HOLDINGS with the right hash. With Config.Source (protocol version 3),
// ASSIGN names the model source and each expert's byte ranges in it
// (Catalog.Ranges), and workers fetch the bytes from there; a catalog
// without bytes (a backbone-only file's) answers CHUNK_REQ with ERROR
// CodeNotAssign.
//
// Assignment policy (plan, place), recomputed when a worker joins, leaves,
// changes its holdings or quota, and every ReplanEvery:
//
//  1. Hot experts stay on the backbone and are not assigned: with
//     Config.LocalHeld, the experts the backbone holds; otherwise an expert
//     is hot when at least HotMinTokens rows of its layer were routed and
//     the share of them routed to it (pairs / rows) is >= HotShare.
//  2. Coverage first: every other expert, most routed first (ties: layer,
//     expert), goes to one worker: a worker holding it (accepted holdings)
//     that has room, else one that had it in its previous assignment, else
//     the worker with the most free quota that can hold it (ties: the
//     higher HELLO speed hint, then session id). Experts none can take are
//     reported (Stats.PlanUncovered: the total quota is too small, or no
//     single worker has room for them) and logged.
//  3. Then replicas, most routed first, until Replicas workers hold each:
//     again holders, then previous assignments, then the most free quota.
//     Only routed experts are replicated, or every expert with
//     Config.LocalHeld (workers are then the only copies, and replicas are
//     what failover and verification by replica comparison use) or under
//     quorum verification (an expert with one holder is computed by the
//     backbone, or waits for a second holder).
//
// The sum of a worker's assigned expert sizes never exceeds its quota.

// placeWorker is one worker's input to place.
type placeWorker struct {
	quota      int64
	speed      uint32
	held, prev map[uint64]bool
	// id is the worker's key: two sessions under one key (two processes
	// sharing a key file) are one holder for quorum, coverage and
	// readiness, so place never gives them copies of the same expert. ""
	// is a key of its own.
	id string
}

// placement is place's result.
type placement struct {
	keys      []map[uint64]bool // per worker, its assignment
	used      []int64           // per worker, its assigned bytes
	uncovered []uint64          // candidates no worker could take
}

// place assigns cands (experts in priority order) to ws within their
// quotas: coverage, then replicas of those for which replicate is true, up
// to replicas holders each (see the policy above).
func place(ws []placeWorker, cands []uint64, size func(uint64) int64, replicas int, replicate func(uint64) bool) placement {
	p := placement{keys: make([]map[uint64]bool, len(ws)), used: make([]int64, len(ws))}
	for i := range ws {
		p.keys[i] = map[uint64]bool{}
	}
	cover := map[uint64]int{}
	// twins[i]: the other sessions under i's key (usually none: the
	// checks below stay O(1) per worker in a large swarm).
	byID := map[string][]int{}
	for i, w := range ws {
		if w.id != "" {
			byID[w.id] = append(byID[w.id], i)
		}
	}
	twins := make([][]int, len(ws))
	for _, is := range byID {
		if len(is) > 1 {
			for _, i := range is {
				twins[i] = is
			}
		}
	}
	// sameKeyHas: another session under i's key already has k.
	sameKeyHas := func(i int, k uint64) bool {
		for _, j := range twins[i] {
			if j != i && p.keys[j][k] {
				return true
			}
		}
		return false
	}
	add := func(i int, k uint64) bool {
		sz := size(k)
		if sz <= 0 || p.keys[i][k] || p.used[i]+sz > ws[i].quota || sameKeyHas(i, k) {
			return false
		}
		p.keys[i][k] = true
		p.used[i] += sz
		cover[k]++
		return true
	}
	roomiest := func(k uint64) int {
		best, bestFree, bestSpeed := -1, int64(-1), uint32(0)
		sz := size(k)
		for i, w := range ws {
			free := w.quota - p.used[i]
			if !p.keys[i][k] && free >= sz && !sameKeyHas(i, k) && (free > bestFree || (free == bestFree && w.speed > bestSpeed)) {
				best, bestFree, bestSpeed = i, free, w.speed
			}
		}
		return best
	}
	sticky := func(want int, ok func(uint64) bool) {
		for _, pref := range []func(w placeWorker, k uint64) bool{
			func(w placeWorker, k uint64) bool { return w.held[k] },
			func(w placeWorker, k uint64) bool { return w.prev[k] },
		} {
			for _, k := range cands {
				for i := 0; i < len(ws) && cover[k] < want && ok(k); i++ {
					if pref(ws[i], k) {
						add(i, k)
					}
				}
			}
		}
	}
	all := func(uint64) bool { return true }
	sticky(1, all)
	for _, k := range cands {
		if cover[k] == 0 {
			if i := roomiest(k); i >= 0 {
				add(i, k)
			}
		}
		if cover[k] == 0 {
			p.uncovered = append(p.uncovered, k)
		}
	}
	sticky(replicas, replicate)
	for _, k := range cands {
		for replicate(k) && cover[k] < replicas {
			i := roomiest(k)
			if i < 0 || !add(i, k) {
				break
			}
		}
	}
	return p
}

// plan recomputes every provisioning worker's assignment and sends ASSIGN to
// those whose assignment changed. It is a no-op without a Catalog.
func (d *Dispatcher) plan() {
	cat := d.cfg.Catalog
	if cat == nil {
		return
	}
	m := d.cfg.Model
	d.mu.Lock()
	var ws []*conn
	for _, c := range d.workers {
		if c.quota > 0 || len(c.order) > 0 { // quota 0 with an assignment: send it an empty one
			ws = append(ws, c)
		}
	}
	sort.Slice(ws, func(i, j int) bool { return ws[i].session < ws[j].session })
	use := func(k uint64) uint64 { return d.usage[int(k>>32)*m.NExpert+int(uint32(k))].Load() }
	hot := d.hotLocked()
	in := make([]placeWorker, len(ws))
	var quota int64
	for i, c := range ws {
		in[i] = placeWorker{quota: int64(c.quota), speed: c.hello.Speed, held: map[uint64]bool{}, prev: map[uint64]bool{}, id: c.worker}
		for k := range c.holds {
			in[i].held[k] = true
		}
		for _, k := range c.order {
			in[i].prev[k] = true
		}
		quota += int64(c.quota)
	}
	cands := make([]uint64, 0, m.NLayer*m.NExpert)
	var need, smallest int64
	for l := 0; l < m.NLayer; l++ {
		for e := 0; e < m.NExpert; e++ {
			if k := key(l, e); !hot[k] {
				cands = append(cands, k)
				sz := cat.Size(l, e)
				need += sz
				if smallest == 0 || sz < smallest {
					smallest = sz
				}
			}
		}
	}
	sort.SliceStable(cands, func(i, j int) bool { return use(cands[i]) > use(cands[j]) })
	size := func(k uint64) int64 { return cat.Size(int(k>>32), int(uint32(k))) }
	replicate := func(k uint64) bool { return use(k) > 0 }
	if d.cfg.LocalHeld != nil || d.quorum() {
		replicate = func(uint64) bool { return true }
	}
	pl := place(in, cands, size, d.cfg.Replicas, replicate)
	prevUncovered := d.planUncovered.Swap(int64(len(pl.uncovered)))
	d.planNeed.Store(need)
	d.planQuota.Store(quota)
	if len(pl.uncovered) > 0 && int64(len(pl.uncovered)) != prevUncovered && len(ws) > 0 {
		d.log.Warn("dispatch: the workers' quotas cannot cover every expert", "uncovered", len(pl.uncovered),
			"experts", len(cands), "need_bytes", need, "quota_bytes", quota, "workers", len(ws))
	}
	var changed []*conn
	for i, c := range ws {
		order := make([]uint64, 0, len(pl.keys[i]))
		for k := range pl.keys[i] {
			order = append(order, k)
		}
		slices.SortFunc(order, func(a, b uint64) int {
			if ua, ub := use(a), use(b); ua != ub {
				if ua > ub {
					return -1
				}
				return 1
			}
			if a < b {
				return -1
			}
			return 1
		})
		// A new worker whose quota holds no expert gets its (empty)
		// assignment too, so that it can tell its user why it holds
		// nothing (engine/worker: the quota is smaller than one expert).
		tooSmall := c.assignGen == 0 && len(order) == 0 && c.quota > 0 && int64(c.quota) < smallest
		if !sameKeys(c.order, order) || tooSmall {
			c.order = order
			c.target = pl.keys[i]
			c.assignedBytes.Store(uint64(pl.used[i]))
			c.nassigned.Store(int64(len(order)))
			c.assignGen++
			changed = append(changed, c)
		}
	}
	d.mu.Unlock()
	for _, c := range changed {
		// plan runs on goroutines d.wg tracks (links, the replan ticker), so
		// the counter is > 0 here and Close waits for these too: the
		// catalog's views must not be read after Close.
		d.wg.Add(1)
		go func() { defer d.wg.Done(); c.sendAssign() }()
	}
}

func sameKeys(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	x, y := slices.Clone(a), slices.Clone(b)
	slices.Sort(x)
	slices.Sort(y)
	return slices.Equal(x, y)
}

// hotLocked returns the hot experts (see the policy above); d.mu held.
func (d *Dispatcher) hotLocked() map[uint64]bool {
	m := d.cfg.Model
	hot := map[uint64]bool{}
	if d.cfg.LocalHeld != nil {
		for l := 0; l < m.NLayer; l++ {
			for e := 0; e < m.NExpert; e++ {
				if d.cfg.LocalHeld(l, e) {
					hot[key(l, e)] = true
				}
			}
		}
		return hot
	}
	for l := 0; l < m.NLayer; l++ {
		rows := d.rows[l].Load()
		if rows == 0 || rows < d.cfg.HotMinTokens {
			continue
		}
		for e := 0; e < m.NExpert; e++ {
			if float64(d.usage[l*m.NExpert+e].Load())/float64(rows) >= d.cfg.HotShare {
				hot[key(l, e)] = true
			}
		}
	}
	return hot
}

// HotExperts returns the experts the policy keeps on the backbone now, as
// (layer, expert) pairs in order.
func (d *Dispatcher) HotExperts() [][2]int {
	d.mu.Lock()
	hot := d.hotLocked()
	d.mu.Unlock()
	var out [][2]int
	for k := range hot {
		out = append(out, [2]int{int(k >> 32), int(uint32(k))})
	}
	slices.SortFunc(out, func(a, b [2]int) int {
		if a[0] != b[0] {
			return a[0] - b[0]
		}
		return a[1] - b[1]
	})
	return out
}

// Routing returns how many (row, slot) pairs ComputeExperts routed to
// expert e of layer l and how many rows it computed for layer l, since
// start.
func (d *Dispatcher) Routing(l, e int) (pairs, rows uint64) {
	m := d.cfg.Model
	if l < 0 || l >= m.NLayer || e < 0 || e >= m.NExpert {
		return 0, 0
	}
	return d.usage[l*m.NExpert+e].Load(), d.rows[l].Load()
}

// Replan recomputes the assignments now (it also runs on every worker
// change and every ReplanEvery). Do not call it concurrently with or after
// Close.
func (d *Dispatcher) Replan() { d.plan() }

// sendAssign builds and sends the conn's current assignment as ASSIGN
// (computing chunk hashes on first use); a newer assignment supersedes it.
func (c *conn) sendAssign() {
	c.amu.Lock()
	defer c.amu.Unlock()
	d := c.d
	cat := d.cfg.Catalog
	d.mu.Lock()
	gen, order := c.assignGen, slices.Clone(c.order)
	d.mu.Unlock()
	if gen == c.sentGen {
		return
	}
	h := cat.Header()
	a := &wire.Assign{ModelID: h.ModelID, Arch: h.Architecture, DFF: uint32(h.DFF), ChunkSize: uint32(d.cfg.ChunkSize),
		Source: d.cfg.Source}
	if sum, err := hex.DecodeString(h.ModelSHA256); err == nil {
		copy(a.ModelSHA256[:], sum)
	}
	layers := map[int]bool{}
	for _, k := range order {
		select {
		case <-d.stop:
			return
		case <-c.done:
			return
		default:
		}
		l, e := int(k>>32), int(uint32(k))
		s, ok := cat.Sums(l, e, d.cfg.ChunkSize)
		if !ok {
			continue
		}
		if !layers[l] {
			layers[l] = true
			le := h.Layers[l]
			g, u, dn, _ := le.Types()
			a.Layers = append(a.Layers, wire.LayerTypes{Layer: uint16(l), Gate: uint32(g), Up: uint32(u), Down: uint32(dn)})
		}
		x := wire.Assigned{Layer: uint16(l), Expert: uint32(e), Size: uint64(cat.Size(l, e)), SHA256: s.SHA256, Chunks: s.Chunks}
		if a.Source != "" {
			for _, r := range cat.Ranges(l, e) {
				x.Ranges = append(x.Ranges, wire.Range{Offset: r.Offset, Len: r.Len})
			}
			if len(x.Ranges) == 0 {
				continue // no layout known: cannot be fetched from the source
			}
		}
		a.Experts = append(a.Experts, x)
	}
	if len(a.Layers) == 0 {
		le := h.Layers[0]
		g, u, dn, _ := le.Types()
		a.Layers = append(a.Layers, wire.LayerTypes{Layer: 0, Gate: uint32(g), Up: uint32(u), Down: uint32(dn)})
	}
	d.mu.Lock()
	stale := gen != c.assignGen
	d.mu.Unlock()
	if stale {
		return
	}
	if err := c.sendData(a.Append(nil), 10*time.Second); err != nil {
		c.close(wire.CodeShutdown, "ASSIGN write: "+err.Error())
		return
	}
	c.sentGen = gen
	c.assigns.Add(1)
}

// chunkReq handles a worker's CHUNK_REQ: an expert of its assignment and a
// range inside it is queued for the chunk sender; anything else is refused
// with ERROR CodeNotAssign. It returns a reason to close the session.
func (c *conn) chunkReq(r *wire.ChunkReq) string {
	d := c.d
	l, e := int(r.Layer), int(r.Expert)
	d.mu.Lock()
	ok := c.target[key(l, e)]
	d.mu.Unlock()
	size := int64(0)
	if d.cfg.Catalog != nil {
		size = d.cfg.Catalog.Size(l, e)
	}
	if !ok || r.Offset >= uint64(size) || uint64(r.Len) > uint64(size)-r.Offset || !d.cfg.Catalog.HasBytes() {
		msg := fmt.Sprintf("layer %d expert %d bytes %d+%d not assigned", l, e, r.Offset, r.Len)
		if ok && !d.cfg.Catalog.HasBytes() {
			msg = "this backbone holds no expert bytes: fetch them from the model source (protocol version 3)"
		}
		if err := c.sendData((&wire.Error{Code: wire.CodeNotAssign, Message: msg}).Append(nil), 5*time.Second); err != nil {
			return "ERROR write: " + err.Error()
		}
		return ""
	}
	c.chunkReqs.Add(1)
	select {
	case c.chunks <- r:
		return ""
	default:
		return fmt.Sprintf("more than %d chunk requests in flight", cap(c.chunks))
	}
}

// chunkSender serves queued CHUNK_REQs until the session closes: each
// CHUNK waits for the rate limit (token bucket: RateLimit bytes/s, burst
// of one ChunkSize) and for any DISPATCH or control frame waiting to be
// written (those go first; at most one CHUNK is ever ahead of a DISPATCH).
func (c *conn) chunkSender() {
	d := c.d
	rate := d.cfg.RateLimit
	burst := float64(d.cfg.ChunkSize) // a request is at most one chunk in practice; larger ones wait for a full bucket
	tokens, last := burst, time.Now()
	var buf []byte
	for {
		var r *wire.ChunkReq
		select {
		case <-c.done:
			return
		case r = <-c.chunks:
		}
		n := int(r.Len)
		if rate > 0 {
			now := time.Now()
			tokens = min(burst, tokens+now.Sub(last).Seconds()*rate)
			last = now
			if need := min(float64(n), burst) - tokens; need > 0 {
				t := time.NewTimer(time.Duration(need / rate * 1e9))
				select {
				case <-c.done:
					t.Stop()
					return
				case <-t.C:
				}
				now = time.Now()
				tokens = min(burst, tokens+now.Sub(last).Seconds()*rate)
				last = now
			}
			tokens -= float64(n)
		}
		data := make([]byte, n)
		if !d.cfg.Catalog.ReadAt(int(r.Layer), int(r.Expert), data, int64(r.Offset)) {
			continue
		}
		buf = (&wire.Chunk{Layer: r.Layer, Expert: r.Expert, Offset: r.Offset, Data: data}).Append(buf[:0])
		if err := c.sendLow(buf); err != nil {
			c.close(wire.CodeShutdown, "CHUNK write: "+err.Error())
			return
		}
		c.chunkBytes.Add(uint64(n))
	}
}

// holdingsUpdate applies a worker's HOLDINGS: added experts whose hash
// matches the backbone's are routed to from now on, dropped ones no longer;
// the quota is updated and the assignments replanned.
func (c *conn) holdingsUpdate(h *wire.Holdings) {
	d := c.d
	d.mu.Lock()
	holds := make(map[uint64]struct{}, len(c.holds)+len(h.Add))
	for k := range c.holds {
		holds[k] = struct{}{}
	}
	for _, x := range h.Add {
		if d.cfg.ExpertHash != nil {
			if sum, ok := d.cfg.ExpertHash(int(x.Layer), int(x.Expert)); !ok || sum != x.SHA256 {
				continue
			}
		}
		holds[key(int(x.Layer), int(x.Expert))] = struct{}{}
	}
	for _, x := range h.Drop {
		delete(holds, key(int(x.Layer), int(x.Expert)))
	}
	if len(h.Drop) > 0 && len(c.order) > 0 {
		// The worker deleted experts: send it its next assignment even if
		// the plan keeps the same experts, so it fetches them again.
		c.order = c.order[:0:0]
		c.nassigned.Store(0)
	}
	c.holds = holds
	c.nholds.Store(int64(len(holds)))
	c.quota = h.Quota
	c.quotaNow.Store(h.Quota)
	if d.workers[c.session] == c {
		d.rebuildLocked()
	}
	d.mu.Unlock()
	d.plan()
}
