package model

import (
	"fmt"
	"math"
)

// A checkpoint lets a Sequence go back to an earlier length exactly,
// recurrent layers included: speculative decoding runs a draft's k+1
// verification rows in one Forward and then keeps only the accepted ones.
//
// KV layers need nothing: Truncate drops positions. A recurrent layer's
// state holds no history, so Checkpoint copies it (conv and SSM state of
// every recurrent layer: Model.StateBytes bytes) and, until the checkpoint
// ends, every Forward logs each of the sequence's rows' inputs to the
// recurrence of every recurrent layer: the attn_qkv output before the
// convolution (2*K*S + H*S floats), beta and g (H each), ~ (2*K*S + H*S +
// 2H) x 4 bytes per row per recurrent layer (32 KiB for Qwen3.5-35B-A3B).
// Truncate(n) to a length the checkpoint covers restores the copy and
// replays the first n - checkpoint rows through the same convolution and
// delta-rule code Forward runs (convRow, deltaStep): the state is
// bit-identical to one that had only ever seen those rows, with no matrix
// product, no expert call and no round trip (the replay costs the
// recurrence alone: per row and recurrent layer, H x S x S x ~6 flops, run
// on the caller's goroutine). Re-running the accepted rows through Forward
// instead would cost a second chain of expert round trips; keeping a copy
// of the state after every row would copy StateBytes per row.

// checkpoint is a Sequence's saved recurrent state and the rows logged
// since (see Sequence.Checkpoint); its buffers are kept for the next one.
type checkpoint struct {
	n      int         // the sequence's Len at Checkpoint
	logged int         // rows of complete Forwards logged since
	conv   [][]float32 // per layer: the recurrent conv state at Checkpoint (nil: KV layer)
	ssm    [][]float32 // per layer: the delta-rule state at Checkpoint
	log    [][]float32 // per layer: logged rows, each mixed (conv floats) | beta (H) | g (H)
	win    []float32   // replay scratch: the convolution window
	cv, o  []float32   // replay scratch: one row's conv output and delta-rule output
}

// Checkpoint marks the sequence's current length as one that Truncate can
// return to exactly until the checkpoint ends; Truncate (to any length)
// and the next Checkpoint end it. Without recurrent layers it only
// records the length (Truncate can rewind a KV cache anyway). With them it
// copies the recurrent state (Model.StateBytes bytes) and makes each
// Forward log the sequence's rows, as described above; a checkpoint left
// open keeps logging, so end it after the rows it guards. It fails with
// ErrRewind on a sequence whose state a failed Forward lost.
func (s *Sequence) Checkpoint() error {
	if s.lost {
		return fmt.Errorf("%w: the recurrent state was lost by a failed Forward; Truncate(0) resets it", ErrRewind)
	}
	if !s.recurrent {
		s.cp = &checkpoint{n: s.n}
		return nil
	}
	cp := s.spare
	if cp == nil {
		cp = &checkpoint{conv: make([][]float32, len(s.mem)), ssm: make([][]float32, len(s.mem)), log: make([][]float32, len(s.mem))}
	}
	cp.n, cp.logged = s.n, 0
	for l := range s.mem {
		if s.mem[l].conv == nil {
			continue
		}
		cp.conv[l] = append(cp.conv[l][:0], s.mem[l].conv...)
		cp.ssm[l] = append(cp.ssm[l][:0], s.mem[l].ssm...)
	}
	s.cp, s.spare = cp, nil
	return nil
}

// endCheckpoint ends the open checkpoint, keeping its buffers.
func (s *Sequence) endCheckpoint() {
	if s.cp != nil && s.recurrent {
		s.spare = s.cp
	}
	s.cp = nil
}

// logRows appends layer il's inputs to the recurrence for rows (one
// sequence's rows of the current Forward, in order) after the rows of
// earlier complete Forwards: ws.mixed's row (conv floats), ws.beta's and
// ws.gdt's (h each). A failed Forward's rows are overwritten by the next.
func (cp *checkpoint) logRows(il int, rows []int32, conv, h int, ws *workspace) {
	stride := conv + 2*h
	need := (cp.logged + len(rows)) * stride
	lg := cp.log[il]
	if cap(lg) < need {
		lg = append(lg[:cap(lg)], make([]float32, need-cap(lg))...)
	}
	lg = lg[:need]
	for t, r := range rows {
		dst := lg[(cp.logged+t)*stride : (cp.logged+t+1)*stride]
		copy(dst, ws.mixed[int(r)*conv:(int(r)+1)*conv])
		copy(dst[conv:], ws.beta[int(r)*h:(int(r)+1)*h])
		copy(dst[conv+h:], ws.gdt[int(r)*h:(int(r)+1)*h])
	}
	cp.log[il] = lg
}

// restore sets every recurrent layer's state to the checkpoint's and
// replays the first rows logged rows into it (convRow and deltaStep, as
// Forward computes them).
func (s *Sequence) restore(rows int) {
	cp, p := s.cp, s.m.p
	H, K, S, kc := p.SSMHeads, p.SSMGroups, p.SSMState, p.SSMConv
	conv := 2*K*S + H*S
	stride := conv + 2*H
	scale := 1 / float32(math.Sqrt(float64(S)))
	if len(cp.win) < (kc-1+rows)*conv {
		cp.win = make([]float32, (kc-1+rows)*conv)
	}
	if len(cp.cv) < conv {
		cp.cv, cp.o = make([]float32, conv), make([]float32, S)
	}
	for l := range s.mem {
		lm := &s.mem[l]
		if lm.conv == nil {
			continue
		}
		copy(lm.conv, cp.conv[l])
		copy(lm.ssm, cp.ssm[l])
		if rows == 0 {
			continue
		}
		g := s.m.Blocks[l].Linear
		win := cp.win[:(kc-1+rows)*conv]
		copy(win, lm.conv)
		lg := cp.log[l]
		for t := range rows {
			copy(win[(kc-1+t)*conv:(kc+t)*conv], lg[t*stride:t*stride+conv])
		}
		for t := range rows {
			row := lg[t*stride : (t+1)*stride]
			convRow(p, g, win[t*conv:], cp.cv)
			for h := range H {
				kh := h % K
				q, k, v := cp.cv[kh*S:(kh+1)*S], cp.cv[(K+kh)*S:(K+kh+1)*S], cp.cv[2*K*S+h*S:2*K*S+(h+1)*S]
				deltaStep(headState(p, lm.ssm, h), q, k, v, cp.o, row[conv+h], row[conv+H+h], scale)
			}
		}
		copy(lm.conv, win[rows*conv:])
	}
}
