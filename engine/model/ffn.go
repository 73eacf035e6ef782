package model

import "github.com/kvasir-ai/kvasir/engine/expert"

// FeedForward is a SwiGLU feed-forward network (llama.cpp
// src/llama-graph.cpp build_ffn with LLM_FFN_SILU and LLM_FFN_PAR at
// commit 3f545bec), computed on the backbone: a dense layer's FFN
// (Block.Dense: ffn_gate, ffn_up, ffn_down) or a shared expert's
// (SharedExpert: the same names with the suffix _shexp):
//
//	ffn(x) = Down( silu(Gate x) * (Up x) )
type FeedForward struct {
	Gate Weight // FF x Embd
	Up   Weight // FF x Embd
	Down Weight // Embd x FF
}

// feedForward computes f on the n rows of ws.xn into ws.ffOut (n x Embd).
func (m *Model) feedForward(f *FeedForward, n int) error {
	ws, d, ff := &m.ws, m.p.Embd, f.Gate.Rows
	x := ws.xn[:n*d]
	if err := m.projectAll(x, n, proj{w: &f.Gate, y: ws.ffGate[:n*ff]}, proj{w: &f.Up, y: ws.ffUp[:n*ff]}); err != nil {
		return err
	}
	return m.ffDown(f, n)
}

// ffDown is the rest of feedForward once the gate and up projections are
// in ws.ffGate and ws.ffUp: silu(gate) * up, then f's down projection into
// ws.ffOut.
func (m *Model) ffDown(f *FeedForward, n int) error {
	ws, d, ff := &m.ws, m.p.Embd, f.Gate.Rows
	expert.SwiGLU(ws.ffGate[:n*ff], ws.ffGate[:n*ff], ws.ffUp[:n*ff])
	return m.project(ws.ffGate[:n*ff], n, &f.Down, ws.ffOut[:n*d])
}

// dense runs a dense layer's FFN on the n rows of ws.xn and adds its
// output to ws.x (cur = ffn_out + ffn_inp).
func (m *Model) dense(f *FeedForward, n int) error {
	if err := m.feedForward(f, n); err != nil {
		return err
	}
	ws, d := &m.ws, m.p.Embd
	for i, v := range ws.ffOut[:n*d] {
		ws.x[i] += v
	}
	return nil
}

// feedForward loads layer il's SwiGLU FFN of ff rows: blk.<il>.ffn_gate,
// ffn_up and ffn_down with the name suffix suffix ("" for a dense layer,
// "_shexp" for a shared expert).
func (l *loader) feedForward(p *Params, il int, suffix string, ff int) FeedForward {
	n := func(s string) string { return blk(il, s+suffix+".weight") }
	return FeedForward{
		Gate: l.matrix(n("ffn_gate"), ff, p.Embd),
		Up:   l.matrix(n("ffn_up"), ff, p.Embd),
		Down: l.matrix(n("ffn_down"), p.Embd, ff),
	}
}
