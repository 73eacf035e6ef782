package worker

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/kvasir-ai/kvasir/engine/quant"
	"github.com/kvasir-ai/kvasir/engine/slice"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// Downloads (protocol version 2, engine/wire ASSIGN/CHUNK_REQ/CHUNK/
// HOLDINGS). With Config.SliceDir the worker keeps its experts in an
// engine/slice.Store: on ASSIGN it drops held experts and partial files the
// assignment does not list (HOLDINGS drop), then fetches each missing
// assigned expert in order: the partial file is verified chunk by chunk
// (slice.Store.Resume) and the download continues after the last verified
// chunk, with DownloadWindow CHUNK_REQs in flight; each CHUNK is checked
// against its chunk SHA-256 before it is written; the complete file is
// checked against the expert's SHA-256, renamed into the slice and listed
// in the manifest (slice.Store.Commit), and announced (HOLDINGS add) so the
// backbone routes to it. An expert that does not fit the quota is skipped.
// An ASSIGN that names a model source is fetched from it instead
// (source.go).

// dlEvent is what the session's reader hands the downloader.
type dlEvent struct {
	assign *wire.Assign
	chunk  *wire.Chunk
	refuse *wire.Error // CodeNotAssign
}

// errSuperseded: a newer ASSIGN arrived during a download.
var errSuperseded = errors.New("worker: assignment superseded")

// downloader runs one session's downloads until sctx ends.
//
// An assignment applied with experts left undownloaded that would fit the
// quota (a model source that failed Config.SourceAttempts times, a chunk
// refused) is applied again after Config.SkipRetry, doubling per such pass
// up to 10 minutes, until a new ASSIGN arrives or nothing is left: a
// backbone sends ASSIGN only when its plan changes, so a source outage of
// a few minutes used to leave the experts missing until a restart.
func (w *Worker) downloader(ctx context.Context, wel *wire.Welcome, ev <-chan dlEvent, send func([]byte) error) error {
	var pending, last *wire.Assign
	var retry <-chan time.Time
	delay := w.cfg.SkipRetry
	for {
		if pending == nil {
			select {
			case <-ctx.Done():
				return nil
			case e := <-ev:
				if e.assign != nil {
					pending, retry, delay = e.assign, nil, w.cfg.SkipRetry
				}
				continue
			case <-retry:
				pending, retry = last, nil
				continue
			}
		}
		a := pending
		pending = nil
		next, err := w.applyAssign(ctx, wel, a, ev, send)
		if err != nil && !errors.Is(err, errSuperseded) {
			return err
		}
		pending = next
		if next == nil && err == nil {
			if n := w.unfetched(a); n > 0 {
				w.log.Info("worker: assigned experts not downloaded; trying again", "experts", n, "in", delay)
				last, retry = a, time.After(delay)
				delay = min(2*delay, 10*time.Minute)
			}
		}
	}
}

// unfetched counts a's experts that are not held and would fit the quota.
func (w *Worker) unfetched(a *wire.Assign) int {
	st, n := w.store, 0
	for _, e := range a.Experts {
		l, x := int(e.Layer), int(e.Expert)
		if !st.Holds(l, x) && st.Used()-st.Partial(l, x)+int64(e.Size) <= st.Quota() {
			n++
		}
	}
	return n
}

// header returns the slice manifest header described by a and wel.
func header(wel *wire.Welcome, a *wire.Assign) (*slice.Manifest, error) {
	m := &slice.Manifest{Format: slice.FormatName, Version: slice.FormatVersion, ModelID: a.ModelID,
		ModelSHA256: hex.EncodeToString(a.ModelSHA256[:]), Architecture: a.Arch, NLayer: int(wel.NLayer),
		NExpert: int(wel.NExpert), DModel: int(wel.D), DFF: int(a.DFF)}
	for _, l := range a.Layers {
		g, u, d := quant.Type(l.Gate), quant.Type(l.Up), quant.Type(l.Down)
		eb, err := slice.ExpertBytes(g, u, d, m.DModel, m.DFF)
		if err != nil {
			return nil, fmt.Errorf("layer %d: %w", l.Layer, err)
		}
		m.Layers = append(m.Layers, slice.LayerEntry{Layer: int(l.Layer), GateType: g.String(), UpType: u.String(),
			DownType: d.String(), ExpertBytes: eb, Experts: []slice.ExpertEntry{}})
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	for _, e := range a.Experts {
		for _, l := range m.Layers {
			if l.Layer == int(e.Layer) && l.ExpertBytes != int64(e.Size) {
				return nil, fmt.Errorf("%w: layer %d expert %d of %d bytes, the types give %d", slice.ErrManifest, e.Layer, e.Expert, e.Size, l.ExpertBytes)
			}
		}
	}
	return m, nil
}

// applyAssign makes the store match a: drops, then downloads. It returns
// a newer ASSIGN that arrived meanwhile (and errSuperseded), or nil when
// done. Other errors end the session.
func (w *Worker) applyAssign(ctx context.Context, wel *wire.Welcome, a *wire.Assign, ev <-chan dlEvent, send func([]byte) error) (*wire.Assign, error) {
	st := w.store
	h, err := header(wel, a)
	if err != nil {
		w.setErr("ASSIGN refused: " + err.Error())
		return nil, nil
	}
	was := st.ModelID()
	dropped, err := st.SetModel(h)
	if err != nil {
		w.setErr("ASSIGN refused: " + err.Error())
		return nil, nil
	}
	if was != "" && was != h.ModelID {
		w.log.Warn("worker: the slice held another model; its experts are deleted and the backbone's downloaded",
			"slice_model", was, "model", h.ModelID, "deleted", len(dropped))
	}
	// Keep an assigned expert only with the assigned bytes: a folder cut
	// from other weights under the same model id (the id does not cover
	// the weights) held experts the backbone refused at HELLO, and kept
	// them forever, counted in the quota and never fetched again.
	want := make(map[uint64][32]byte, len(a.Experts))
	for _, e := range a.Experts {
		want[hkey(int(e.Layer), int(e.Expert))] = e.SHA256
	}
	have := map[uint64][32]byte{}
	for _, hd := range st.Holdings() {
		have[hkey(int(hd.Layer), int(hd.Expert))] = hd.SHA256
	}
	more, err := st.Retain(func(l, e int) bool {
		sum, assigned := want[hkey(l, e)]
		held, isHeld := have[hkey(l, e)]
		return assigned && (!isHeld || held == sum) // a partial download's chunks are checked as they resume
	})
	dropped = append(dropped, more...)
	if err != nil {
		w.setErr("drop: " + err.Error())
	}
	if len(dropped) > 0 {
		if err := send((&wire.Holdings{Quota: uint64(st.Quota()), Drop: dropped}).Append(nil)); err != nil {
			return nil, err
		}
	}
	w.progress(a)
	if len(a.Experts) == 0 && st.Quota() > 0 {
		if small := smallestExpert(wel, a); small > st.Quota() {
			// Nothing fits: say so, or the worker shows "connected" and
			// 0 rows/s with no reason.
			w.setErr(fmt.Sprintf("the backbone assigned no experts: the quota (%d bytes) is smaller than one expert of this model (%d bytes); raise --quota",
				st.Quota(), small))
		}
	}
	for _, e := range a.Experts {
		l, x := int(e.Layer), int(e.Expert)
		if st.Holds(l, x) {
			continue
		}
		if st.Used()-st.Partial(l, x)+int64(e.Size) > st.Quota() {
			continue // does not fit (the backbone's plan and our quota disagree)
		}
		fetch := w.fetch
		if a.Source != "" {
			fetch = w.fetchSource
		}
		next, err := fetch(ctx, a, e, ev, send)
		if next != nil || err != nil {
			return next, err
		}
		w.progress(a)
	}
	return nil, nil
}

// fetch downloads one expert; see the package comment on downloads.
func (w *Worker) fetch(ctx context.Context, a *wire.Assign, e wire.Assigned, ev <-chan dlEvent, send func([]byte) error) (*wire.Assign, error) {
	st := w.store
	l, x := int(e.Layer), int(e.Expert)
	chunk := int64(a.ChunkSize)
	size := int64(e.Size)
	for attempt := 0; attempt < 3; attempt++ {
		off, err := st.Resume(l, x, int(chunk), e.Chunks)
		if err != nil {
			w.setErr("resume: " + err.Error())
			return nil, nil
		}
		w.progress(a)
		requested := map[uint64]bool{}
		next := off
		failed := false
		for off < size && !failed {
			if next, err = w.requestChunks(e, requested, next, size, chunk, send); err != nil {
				return nil, err
			}
			var m dlEvent
			select {
			case <-ctx.Done():
				return nil, nil
			case m = <-ev:
			}
			switch {
			case m.assign != nil:
				return m.assign, errSuperseded
			case m.refuse != nil:
				w.setErr("download refused: " + m.refuse.Message)
				return nil, nil // the backbone will send a new ASSIGN
			}
			c := m.chunk
			if int(c.Layer) != l || int(c.Expert) != x || !requested[c.Offset] {
				continue // a stale chunk of an earlier request
			}
			delete(requested, c.Offset)
			if int64(c.Offset) != off {
				failed = true // out of order: start over from the verified length
				break
			}
			i := int(off / chunk)
			if err := st.WriteChunk(l, x, off, c.Data, e.Chunks[i]); err != nil {
				if errors.Is(err, slice.ErrQuota) {
					st.Abort(l, x)
					w.setErr(err.Error())
					return nil, nil
				}
				w.setErr("chunk: " + err.Error())
				failed = true
				break
			}
			off += int64(len(c.Data))
			w.dlDone.Add(uint64(len(c.Data)))
			w.chunksGot.Add(1)
		}
		if failed {
			if newer, ok := drainChunks(ctx, ev, l, x, requested); !ok {
				return nil, nil
			} else if newer != nil {
				return newer, errSuperseded
			}
			continue
		}
		if err := st.Commit(l, x, e.SHA256); err != nil {
			w.setErr("commit: " + err.Error())
			if errors.Is(err, slice.ErrCorrupt) {
				continue
			}
			return nil, nil
		}
		return nil, w.held(a, e, send)
	}
	st.Abort(l, x)
	return nil, nil
}

// requestChunks sends CHUNK_REQs of expert e (chunk bytes each, up to
// size) from offset next on while fewer than DownloadWindow are in flight
// (requested); it returns the next offset to request.
func (w *Worker) requestChunks(e wire.Assigned, requested map[uint64]bool, next, size, chunk int64, send func([]byte) error) (int64, error) {
	for len(requested) < w.cfg.DownloadWindow && next < size {
		n := min(chunk, size-next)
		if err := send((&wire.ChunkReq{Layer: e.Layer, Expert: e.Expert, Offset: uint64(next), Len: uint32(n)}).Append(nil)); err != nil {
			return next, err
		}
		w.chunkReqs.Add(1)
		requested[uint64(next)] = true
		next += n
	}
	return next, nil
}

// drainChunks waits for the chunks of expert x of layer l still requested,
// so that they are not taken for a retry. It returns a newer ASSIGN that
// arrived meanwhile, or ok false when ctx ended.
func drainChunks(ctx context.Context, ev <-chan dlEvent, l, x int, requested map[uint64]bool) (newer *wire.Assign, ok bool) {
	for len(requested) > 0 {
		select {
		case <-ctx.Done():
			return nil, false
		case m := <-ev:
			if m.assign != nil {
				return m.assign, true
			}
			if m.chunk != nil && int(m.chunk.Layer) == l && int(m.chunk.Expert) == x {
				delete(requested, m.chunk.Offset)
			}
		}
	}
	return nil, true
}

// held announces expert e of a, just committed: the progress first (stats
// never lag the HOLDINGS), then a HOLDINGS adding it.
func (w *Worker) held(a *wire.Assign, e wire.Assigned, send func([]byte) error) error {
	w.progress(a) // before the backbone hears of it: stats never lag the HOLDINGS
	msg := (&wire.Holdings{Quota: uint64(w.store.Quota()), Add: []wire.Holding{{Layer: e.Layer, Expert: e.Expert, SHA256: e.SHA256}}}).Append(nil)
	return send(msg)
}

func hkey(l, e int) uint64 { return uint64(l)<<32 | uint64(uint32(e)) }

// progress recomputes the download progress of assignment a.
func (w *Worker) progress(a *wire.Assign) {
	st := w.store
	var done, total uint64
	var edone, etotal int
	for _, e := range a.Experts {
		total += e.Size
		etotal++
		if st.Holds(int(e.Layer), int(e.Expert)) {
			done += e.Size
			edone++
		} else {
			done += uint64(st.Partial(int(e.Layer), int(e.Expert)))
		}
	}
	w.mu.Lock()
	w.dlBase, w.dlTotal, w.expDone, w.expTotal = done, total, edone, etotal
	w.mu.Unlock()
	w.dlDone.Store(0)
}

func (w *Worker) setErr(s string) {
	w.log.Warn("worker: " + s)
	w.mu.Lock()
	w.st.LastError = s
	w.mu.Unlock()
}

// SetQuota sets the slice's disk quota in bytes (Config.SliceDir only):
// partial downloads, then the least used experts are deleted until the
// slice fits (slice.Store.SetQuota), and the backbone is told (HOLDINGS) so
// it assigns within the new quota. Errors: no SliceDir, or the file
// system's.
func (w *Worker) SetQuota(q int64) error {
	if w.store == nil {
		return errors.New("worker: SetQuota needs Config.SliceDir")
	}
	dropped, err := w.store.SetQuota(max(q, 0))
	w.announce(&wire.Holdings{Quota: uint64(max(q, 0)), Drop: dropped})
	return err
}

// DeleteSlice deletes every expert, partial download and the manifest of
// the slice directory and sets the quota to 0 (the worker takes no
// assignment until SetQuota); the backbone is told. Errors: no SliceDir,
// or the file system's.
func (w *Worker) DeleteSlice() error {
	if w.store == nil {
		return errors.New("worker: DeleteSlice needs Config.SliceDir")
	}
	dropped, err := w.store.SetQuota(0)
	more, derr := w.store.DeleteAll()
	w.announce(&wire.Holdings{Quota: 0, Drop: append(dropped, more...)})
	return errors.Join(err, derr)
}

// announce sends h on the current session, if any (the next HELLO carries
// the state otherwise).
func (w *Worker) announce(h *wire.Holdings) {
	w.mu.Lock()
	send := w.sendNow
	w.mu.Unlock()
	if send != nil {
		_ = send(h.Append(nil))
	}
}

// smallestExpert is the size in bytes of the smallest expert of a's layers
// (slice.ExpertBytes of each layer's types at wel.D x a.DFF); 0 when a
// names no layer or no size can be computed.
func smallestExpert(wel *wire.Welcome, a *wire.Assign) int64 {
	var small int64
	for _, lt := range a.Layers {
		n, err := slice.ExpertBytes(quant.Type(lt.Gate), quant.Type(lt.Up), quant.Type(lt.Down), int(wel.D), int(a.DFF))
		if err == nil && (small == 0 || n < small) {
			small = n
		}
	}
	return small
}
