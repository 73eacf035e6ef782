#!/usr/bin/python3
"""Train kvasir's embedded demo model: a tiny qwen35moe on the King James Bible.

Run by hand (never by the tests), with Debian's python3-torch and python3-numpy
(/usr/bin/python3; torch 1.13 on bookworm). The whole recipe is in
docs/demo-model.md:

    apt-get install -y bible-kjv bible-kjv-text python3-torch python3-numpy libopenblas0-pthread
    bible -l100000 gen1:1-rev22:21 > kjv.txt
    go run ./scripts/train/demomodel prep --kjv kjv.txt --vocab 2048 --dir DIR
    OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=1 nice -n 10 /usr/bin/python3 scripts/train/train_demo.py --dir DIR --minutes 42
    go run ./scripts/train/demomodel export --dir DIR --out engine/demomodel/kjv-qwen35moe.gguf

Corpus: the King James Version (1611), public domain (Crown copyright aside,
which applies in the UK only; Debian's bible-kjv-text ships it as "copyright
expired"), as Debian's bible-kjv prints it: each chapter one line, verses
joined by spaces, verse numbers dropped. The book of Ruth is held out
(engine/demomodel/train.HeldOutBook). Vocabulary: 2048 byte-level BPE tokens
trained by the project's own engine/tokenizer.Train on the training text
(3.70 bytes per token: 1,113,816 training tokens, 3,693 held-out).

Model (the architecture of engine/model/qwen35moe.go and llama.cpp's
qwen35moe, spelled out in fixtures/qwen35moe/README.md; HPARAMS below):
d_model 128, 4 layers (0-2 Gated DeltaNet, 3 gated full attention), DeltaNet
conv 4, 2 key / 4 value heads of 32, attention 4 q / 2 kv heads of 32 with 16
rotated dims (IMROPE sections [3,3,2,0], base 10000), 8 routed experts top-2
of FFN 128 (softmax router, top-k renormalised) plus a sigmoid-gated shared
expert of FFN 128, RMSNorm eps 1e-6, LM head tied to the embedding.

Training: random windows of 128 tokens, batch 16, AdamW (betas 0.9/0.95,
weight decay 0.1 on matrices), lr 3e-3 with 50 warm-up steps and cosine decay
to 3e-4 over a wall-clock budget (--minutes, 45 by default: the schedule
follows the time spent, so a busy machine trains fewer steps), gradient
clipping 1.0, Switch-style load-balancing loss 0.01, seed 1. Run it as
`OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=1 nice -n 10` with
torch.set_num_threads(2) (--threads): on a 2-core machine shared with other
work, OpenMP's busy-waiting otherwise burns most of the CPU time. Debian's
torch uses the system BLAS; install libopenblas0-pthread (the reference BLAS
is 2-3x slower).

What it writes into DIR: hparams.json (the shape, read by
engine/demomodel/train.Export), weights.bin (float32 little-endian tensors)
and weights.json (GGUF tensor name -> offset and PyTorch shape, [out, in]; the
GGUF ne is the reversed shape), written at every evaluation, plus log.txt.

Other modes: --selftest checks the chunked delta rule against the per-token
recurrence (float64 6e-16, float32 7e-7) and the whole forward both ways;
--bench N times N training steps; --eval DIR2 runs the forward on the weights
in DIR2 (written by `demomodel check`: the GGUF's dequantized tensors) and
writes DIR2/torch_ref.json, the greedy continuation of each prompt of
DIR2/prompts.json with each step's top-1/top-2 gap and top-8 logits
(engine/demomodel/testdata).

RESULT of the run that made engine/demomodel/kjv-qwen35moe.gguf (log.txt;
loss = cross-entropy in nats per token; held-out = 24 windows of Ruth):

    step     1  train 7.653  held-out 7.665       7 s
    step   100  train 5.632  held-out 4.829     336 s
    step   300  train 4.132  held-out 4.116     799 s
    step   500  train 3.659  held-out 3.976    1114 s
    step  1000  train 3.169  held-out 3.629    1724 s
    step  1500  train 2.990  held-out 3.528    2164 s
    step  2104  train 2.833  held-out 3.505    2520 s

    2104 steps, 4,308,992 tokens (3.87 epochs) in 42.0 minutes (--minutes 42)
    on 2 shared cores (load average 6-16 from other work); 2,305,848 parameters.
    engine/model measures 1.437 bits per byte on Ruth (3.51 nats per token).
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HPARAMS = dict(
    name="kvasir-kjv-qwen35moe",
    embd=128,
    layers=4,
    heads=4,
    heads_kv=2,
    head_dim=32,
    rope_dim=16,
    rope_sections=[3, 3, 2, 0],
    rope_base=10000.0,
    norm_eps=1e-6,
    experts=8,
    experts_used=2,
    expert_ff=128,
    shared_ff=128,
    full_attn_interval=4,
    ssm_conv=4,
    ssm_state=32,
    ssm_groups=2,
    ssm_dt_rank=4,
    context=128,
)

TRAIN = dict(seq=128, batch=16, minutes=45.0, lr=3e-3, lr_min=3e-4, warmup=50, wd=0.1, clip=1.0,
             aux=0.01, seed=1, eval_every=100, eval_windows=24)


def rmsnorm(x, w, eps):
    """llama.cpp's build_norm(LLM_NORM_RMS): x / sqrt(mean(x^2) + eps) * w."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def l2norm(x, eps):
    """ggml_l2_norm: x / max(||x||, eps) over the last dim."""
    return x / x.norm(dim=-1, keepdim=True).clamp(min=eps)


def delta_rule_chunk(q, k, v, beta, g):
    """The gated delta rule over a whole sequence in one chunk.

    q, k: [B, H, T, S] (q already scaled by 1/sqrt(S)); v: [B, H, T, S];
    beta, g: [B, H, T] (g = log decay, negative). With zero initial state the
    recurrence S_t = e^{g_t} S_{t-1} + k_t w_t^T,
    w_t = beta_t (v_t - e^{g_t} S_{t-1}^T k_t), o_t = S_t^T q_t unrolls to
    (I + L) W = beta V with L[t,s] = beta_t (k_t.k_s) e^{G_t - G_s} (s < t),
    G = cumsum(g), and O = ((Q K^T) * e^{G_t - G_s}, s <= t) W.
    """
    T = q.shape[2]
    G = g.cumsum(-1)
    diff = G[..., :, None] - G[..., None, :]
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    decay = diff.masked_fill(~causal, float("-inf")).exp()
    kk = k @ k.transpose(-1, -2)
    strict = torch.ones(T, T, dtype=torch.bool, device=q.device).tril(-1)
    L = (beta[..., :, None] * kk * decay).masked_fill(~strict, 0.0)
    A = L + torch.eye(T, dtype=q.dtype, device=q.device)
    W = torch.linalg.solve_triangular(A, beta[..., None] * v, upper=False, unitriangular=True)
    return ((q @ k.transpose(-1, -2)) * decay) @ W


def delta_rule_loop(q, k, v, beta, g):
    """The per-token recurrence, as engine/model's deltaStep runs it."""
    B, H, T, S = q.shape
    st = q.new_zeros(B, H, S, S)  # st[i, j] = S_h[i][j], keys x values
    out = []
    for t in range(T):
        st = st * g[:, :, t, None, None].exp()
        u = torch.einsum("bhij,bhi->bhj", st, k[:, :, t])
        w = beta[:, :, t, None] * (v[:, :, t] - u)
        st = st + k[:, :, t, :, None] * w[:, :, None, :]
        out.append(torch.einsum("bhij,bhi->bhj", st, q[:, :, t]))
    return torch.stack(out, 2)


class DeltaNet(nn.Module):
    """Gated DeltaNet (engine/model/deltanet.go), tensors named as in GGUF."""

    def __init__(self, h):
        super().__init__()
        d, S, K, H = h["embd"], h["ssm_state"], h["ssm_groups"], h["ssm_dt_rank"]
        self.S, self.K, self.H, self.kc, self.eps = S, K, H, h["ssm_conv"], h["norm_eps"]
        conv = 2 * K * S + H * S
        self.attn_qkv = nn.Linear(d, conv, bias=False)
        self.attn_gate = nn.Linear(d, H * S, bias=False)
        self.ssm_conv1d = nn.Parameter(torch.randn(conv, self.kc) / math.sqrt(self.kc))
        dt = torch.exp(torch.rand(H) * (math.log(0.1) - math.log(0.001)) + math.log(0.001))
        self.ssm_dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)
        self.A_log = nn.Parameter(torch.log(torch.empty(H).uniform_(1, 16)))
        self.ssm_beta = nn.Linear(d, H, bias=False)
        self.ssm_alpha = nn.Linear(d, H, bias=False)
        self.ssm_norm = nn.Parameter(torch.ones(S))
        self.ssm_out = nn.Linear(H * S, d, bias=False)

    def forward(self, x, loop=False):
        B, T, _ = x.shape
        S, K, H, kc = self.S, self.K, self.H, self.kc
        mixed = self.attn_qkv(x).transpose(1, 2)  # [B, C, T]
        c = F.conv1d(F.pad(mixed, (kc - 1, 0)), self.ssm_conv1d[:, None, :], groups=mixed.shape[1])
        c = F.silu(c).transpose(1, 2)  # [B, T, C]
        q = l2norm(c[..., :K * S].reshape(B, T, K, S), self.eps)
        k = l2norm(c[..., K * S:2 * K * S].reshape(B, T, K, S), self.eps)
        v = c[..., 2 * K * S:].reshape(B, T, H, S)
        # value head h reads key head h mod K (ggml's tiled broadcast)
        q = q.repeat(1, 1, H // K, 1).transpose(1, 2) / math.sqrt(S)
        k = k.repeat(1, 1, H // K, 1).transpose(1, 2)
        v = v.transpose(1, 2)
        beta = torch.sigmoid(self.ssm_beta(x)).transpose(1, 2)
        g = (F.softplus(self.ssm_alpha(x) + self.ssm_dt_bias) * -self.A_log.exp()).transpose(1, 2)
        o = (delta_rule_loop if loop else delta_rule_chunk)(q, k, v, beta, g).transpose(1, 2)  # [B, T, H, S]
        z = self.attn_gate(x).reshape(B, T, H, S)
        o = rmsnorm(o, self.ssm_norm, self.eps) * F.silu(z)
        return self.ssm_out(o.reshape(B, T, H * S))

    def gguf(self, p):
        return {p + "attn_qkv.weight": self.attn_qkv.weight, p + "attn_gate.weight": self.attn_gate.weight,
                p + "ssm_conv1d.weight": self.ssm_conv1d, p + "ssm_dt.bias": self.ssm_dt_bias,
                p + "ssm_a": -self.A_log.exp(), p + "ssm_beta.weight": self.ssm_beta.weight,
                p + "ssm_alpha.weight": self.ssm_alpha.weight, p + "ssm_norm.weight": self.ssm_norm,
                p + "ssm_out.weight": self.ssm_out.weight}

    def load(self, p, t):
        with torch.no_grad():
            for name, dst in [("attn_qkv.weight", self.attn_qkv.weight), ("attn_gate.weight", self.attn_gate.weight),
                              ("ssm_conv1d.weight", self.ssm_conv1d), ("ssm_dt.bias", self.ssm_dt_bias),
                              ("ssm_beta.weight", self.ssm_beta.weight), ("ssm_alpha.weight", self.ssm_alpha.weight),
                              ("ssm_norm.weight", self.ssm_norm), ("ssm_out.weight", self.ssm_out.weight)]:
                dst.copy_(t[p + name])
            self.A_log.copy_(torch.log(-t[p + "ssm_a"]))


def rope_tables(T, rd, base):
    half = rd // 2
    inv = base ** (-2.0 * torch.arange(half, dtype=torch.float64) / rd)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos().float(), ang.sin().float()


def rope_neox(x, cos, sin, rd):
    """NEOX rotate-half over the first rd dims (IMROPE with one position per token)."""
    half = rd // 2
    x0, x1, rest = x[..., :half], x[..., half:rd], x[..., rd:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x0 * c - x1 * s, x0 * s + x1 * c, rest], -1)


class GatedAttention(nn.Module):
    """qwen35moe's full attention (engine/model/attention.go, Gated)."""

    def __init__(self, h):
        super().__init__()
        d, self.Hq, self.Hkv, self.hd = h["embd"], h["heads"], h["heads_kv"], h["head_dim"]
        self.rd, self.base, self.eps = h["rope_dim"], h["rope_base"], h["norm_eps"]
        self.attn_q = nn.Linear(d, 2 * self.Hq * self.hd, bias=False)
        self.attn_k = nn.Linear(d, self.Hkv * self.hd, bias=False)
        self.attn_v = nn.Linear(d, self.Hkv * self.hd, bias=False)
        self.attn_output = nn.Linear(self.Hq * self.hd, d, bias=False)
        self.attn_q_norm = nn.Parameter(torch.ones(self.hd))
        self.attn_k_norm = nn.Parameter(torch.ones(self.hd))

    def forward(self, x, loop=False):
        B, T, _ = x.shape
        Hq, Hkv, hd = self.Hq, self.Hkv, self.hd
        qg = self.attn_q(x).reshape(B, T, Hq, 2 * hd)  # per head [q_h | gate_h]
        q, gate = qg[..., :hd], qg[..., hd:]
        k = self.attn_k(x).reshape(B, T, Hkv, hd)
        v = self.attn_v(x).reshape(B, T, Hkv, hd)
        cos, sin = rope_tables(T, self.rd, self.base)
        q = rope_neox(rmsnorm(q, self.attn_q_norm, self.eps), cos, sin, self.rd).transpose(1, 2)
        k = rope_neox(rmsnorm(k, self.attn_k_norm, self.eps), cos, sin, self.rd).transpose(1, 2)
        v = v.transpose(1, 2)
        k = k.repeat_interleave(Hq // Hkv, dim=1)  # query head h reads kv head h / (Hq/Hkv)
        v = v.repeat_interleave(Hq // Hkv, dim=1)
        sc = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = sc.masked_fill(~mask, float("-inf")).softmax(-1) @ v  # [B, Hq, T, hd]
        o = att.transpose(1, 2) * torch.sigmoid(gate)
        return self.attn_output(o.reshape(B, T, Hq * hd))

    def gguf(self, p):
        return {p + "attn_q.weight": self.attn_q.weight, p + "attn_k.weight": self.attn_k.weight,
                p + "attn_v.weight": self.attn_v.weight, p + "attn_output.weight": self.attn_output.weight,
                p + "attn_q_norm.weight": self.attn_q_norm, p + "attn_k_norm.weight": self.attn_k_norm}

    def load(self, p, t):
        with torch.no_grad():
            for name, dst in self.gguf(p).items():
                dst.copy_(t[name])


class MoE(nn.Module):
    """Routed experts (softmax, top-k, renormalised) plus the sigmoid-gated shared expert."""

    def __init__(self, h):
        super().__init__()
        d, E, F_, Fs = h["embd"], h["experts"], h["expert_ff"], h["shared_ff"]
        self.E, self.k = E, h["experts_used"]
        self.ffn_gate_inp = nn.Linear(d, E, bias=False)
        self.ffn_gate_exps = nn.Parameter(torch.randn(E, F_, d) * 0.02)
        self.ffn_up_exps = nn.Parameter(torch.randn(E, F_, d) * 0.02)
        self.ffn_down_exps = nn.Parameter(torch.randn(E, d, F_) * 0.02)
        self.ffn_gate_inp_shexp = nn.Parameter(torch.zeros(d))
        self.ffn_gate_shexp = nn.Linear(d, Fs, bias=False)
        self.ffn_up_shexp = nn.Linear(d, Fs, bias=False)
        self.ffn_down_shexp = nn.Linear(Fs, d, bias=False)

    def forward(self, x):
        B, T, d = x.shape
        xf = x.reshape(-1, d)
        probs = self.ffn_gate_inp(xf).softmax(-1)
        topv, topi = probs.topk(self.k, dim=-1)
        w = topv / topv.sum(-1, keepdim=True)
        out = torch.zeros_like(xf)
        for e in range(self.E):
            tok, slot = (topi == e).nonzero(as_tuple=True)
            if tok.numel() == 0:
                continue
            xe = xf[tok]
            he = F.silu(xe @ self.ffn_gate_exps[e].t()) * (xe @ self.ffn_up_exps[e].t())
            out = out.index_add(0, tok, (he @ self.ffn_down_exps[e].t()) * w[tok, slot, None])
        sh = self.ffn_down_shexp(F.silu(self.ffn_gate_shexp(xf)) * self.ffn_up_shexp(xf))
        out = out + torch.sigmoid(xf @ self.ffn_gate_inp_shexp)[:, None] * sh
        # Switch-transformer load balancing: E * sum_e (share of assignments) * (mean probability)
        frac = torch.bincount(topi.reshape(-1), minlength=self.E).float() / topi.numel()
        aux = self.E * (frac * probs.mean(0)).sum()
        return out.reshape(B, T, d), aux

    def gguf(self, p):
        return {p + "ffn_gate_inp.weight": self.ffn_gate_inp.weight, p + "ffn_gate_exps.weight": self.ffn_gate_exps,
                p + "ffn_up_exps.weight": self.ffn_up_exps, p + "ffn_down_exps.weight": self.ffn_down_exps,
                p + "ffn_gate_inp_shexp.weight": self.ffn_gate_inp_shexp,
                p + "ffn_gate_shexp.weight": self.ffn_gate_shexp.weight,
                p + "ffn_up_shexp.weight": self.ffn_up_shexp.weight,
                p + "ffn_down_shexp.weight": self.ffn_down_shexp.weight}

    def load(self, p, t):
        with torch.no_grad():
            for name, dst in self.gguf(p).items():
                dst.copy_(t[name])


class Block(nn.Module):
    def __init__(self, h, il):
        super().__init__()
        self.eps = h["norm_eps"]
        self.recurrent = (il + 1) % h["full_attn_interval"] != 0
        self.mixer = DeltaNet(h) if self.recurrent else GatedAttention(h)
        self.attn_norm = nn.Parameter(torch.ones(h["embd"]))
        self.post_attention_norm = nn.Parameter(torch.ones(h["embd"]))
        self.moe = MoE(h)

    def forward(self, x, loop=False):
        h = x + self.mixer(rmsnorm(x, self.attn_norm, self.eps), loop)
        y, aux = self.moe(rmsnorm(h, self.post_attention_norm, self.eps))
        return h + y, aux


class Model(nn.Module):
    def __init__(self, h, vocab):
        super().__init__()
        self.h, self.eps = h, h["norm_eps"]
        self.token_embd = nn.Parameter(torch.randn(vocab, h["embd"]) * 0.02)
        self.blocks = nn.ModuleList([Block(h, il) for il in range(h["layers"])])
        self.output_norm = nn.Parameter(torch.ones(h["embd"]))
        for n, p in self.named_parameters():
            if p.dim() == 2 and n.endswith("weight") and p is not self.token_embd:
                nn.init.normal_(p, std=0.02)
            if n.endswith(("attn_output.weight", "ssm_out.weight", "ffn_down_shexp.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * h["layers"]))
            if n.endswith("ffn_down_exps"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * h["layers"]))

    def forward(self, ids, loop=False):
        x = self.token_embd[ids]
        aux = 0.0
        for b in self.blocks:
            x, a = b(x, loop)
            aux = aux + a
        x = rmsnorm(x, self.output_norm, self.eps)
        return x @ self.token_embd.t(), aux / len(self.blocks)

    def gguf(self):
        """GGUF name -> tensor, in PyTorch shape (GGUF ne reversed)."""
        t = {"token_embd.weight": self.token_embd, "output_norm.weight": self.output_norm}
        for il, b in enumerate(self.blocks):
            p = "blk.%d." % il
            t[p + "attn_norm.weight"] = b.attn_norm
            t[p + "post_attention_norm.weight"] = b.post_attention_norm
            t.update(b.mixer.gguf(p))
            t.update(b.moe.gguf(p))
        return t

    def load(self, t):
        with torch.no_grad():
            self.token_embd.copy_(t["token_embd.weight"])
            self.output_norm.copy_(t["output_norm.weight"])
            for il, b in enumerate(self.blocks):
                p = "blk.%d." % il
                b.attn_norm.copy_(t[p + "attn_norm.weight"])
                b.post_attention_norm.copy_(t[p + "post_attention_norm.weight"])
                b.mixer.load(p, t)
                b.moe.load(p, t)


def save_weights(model, d):
    index, off = {}, 0
    with open(os.path.join(d, "weights.bin"), "wb") as f:
        for name, t in model.gguf().items():
            a = t.detach().float().contiguous().numpy().astype("<f4")
            f.write(a.tobytes())
            index[name] = {"offset": off, "shape": list(a.shape)}
            off += a.nbytes
    with open(os.path.join(d, "weights.json"), "w") as f:
        json.dump(index, f, indent=1)


def load_weights(d):
    with open(os.path.join(d, "weights.json")) as f:
        index = json.load(f)
    raw = np.fromfile(os.path.join(d, "weights.bin"), dtype="<f4")
    out = {}
    for name, e in index.items():
        n = int(np.prod(e["shape"]))
        o = e["offset"] // 4
        out[name] = torch.from_numpy(raw[o:o + n].reshape(e["shape"]).copy())
    return out


def read_ids(path):
    return torch.from_numpy(np.fromfile(path, dtype="<u2").astype(np.int64))


def vocab_size(d):
    with open(os.path.join(d, "tokenizer.json")) as f:
        return len(json.load(f)["Tokens"])


def selftest():
    torch.manual_seed(0)
    B, H, T, S = 2, 4, 200, 32
    q = l2norm(torch.randn(B, H, T, S, dtype=torch.float64), 1e-6) / math.sqrt(S)
    k = l2norm(torch.randn(B, H, T, S, dtype=torch.float64), 1e-6)
    v = torch.randn(B, H, T, S, dtype=torch.float64)
    beta = torch.rand(B, H, T, dtype=torch.float64)
    g = -torch.rand(B, H, T, dtype=torch.float64) * 0.5
    a, b = delta_rule_chunk(q, k, v, beta, g), delta_rule_loop(q, k, v, beta, g)
    err64 = (a - b).abs().max().item()
    a32 = delta_rule_chunk(q.float(), k.float(), v.float(), beta.float(), g.float())
    err32 = (a32.double() - b).abs().max().item()
    print("selftest: chunked vs per-token delta rule, max |diff| float64 %.2e, float32 %.2e" % (err64, err32))
    if err64 > 1e-10 or err32 > 1e-4:
        sys.exit("selftest failed")
    torch.manual_seed(1)
    m = Model(HPARAMS, 300).double()
    ids = torch.randint(0, 300, (2, 40))
    with torch.no_grad():
        la, _ = m(ids)
        lb, _ = m(ids, loop=True)
    err = (la - lb).abs().max().item()
    print("selftest: model forward chunked vs per-token, max |diff| %.2e" % err)
    if err > 1e-9:
        sys.exit("selftest failed")


def lr_at(step, frac, c):
    """Linear warm-up over c["warmup"] steps, then cosine decay to lr_min over the time budget (frac of it spent)."""
    lr = c["lr_min"] + 0.5 * (c["lr"] - c["lr_min"]) * (1 + math.cos(math.pi * min(1.0, frac)))
    if step < c["warmup"]:
        return lr * (step + 1) / c["warmup"]
    return lr


def evaluate(model, ids, seq, n):
    """Mean cross-entropy (nats/token) over n evenly spaced windows of ids."""
    model.eval()
    starts = np.linspace(0, len(ids) - seq - 1, n).astype(np.int64)
    with torch.no_grad():
        x = torch.stack([ids[s:s + seq] for s in starts])
        y = torch.stack([ids[s + 1:s + seq + 1] for s in starts])
        logits, _ = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()
    model.train()
    return loss


def train(d, c, bench=0):
    torch.manual_seed(c["seed"])
    np.random.seed(c["seed"])
    V = vocab_size(d)
    tr, ho = read_ids(os.path.join(d, "train.u16")), read_ids(os.path.join(d, "heldout.u16"))
    model = Model(HPARAMS, V)
    nparams = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    nodecay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": c["wd"]}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=c["lr"], betas=(0.9, 0.95))
    budget = c["minutes"] * 60
    log = None if bench else open(os.path.join(d, "log.txt"), "w")

    def say(s):
        print(s, flush=True)
        if log:
            log.write(s + "\n")
            log.flush()

    def save():
        h = dict(HPARAMS)
        h["vocab"] = V
        with open(os.path.join(d, "hparams.json"), "w") as f:
            json.dump(h, f, indent=1)
        save_weights(model, d)

    say("params %d; vocab %d; train tokens %d; held-out tokens %d; hparams %s; train %s; threads %d" %
        (nparams, V, len(tr), len(ho), json.dumps(HPARAMS), json.dumps(c), torch.get_num_threads()))
    seq, B = c["seq"], c["batch"]
    t0 = time.time()
    run, step, frac = 0.0, 0, 0.0
    while (bench and step < bench) or (not bench and frac < 1.0):
        lr = lr_at(step, frac, c)
        for gr in opt.param_groups:
            gr["lr"] = lr
        starts = torch.randint(0, len(tr) - seq - 1, (B,))
        x = torch.stack([tr[s:s + seq] for s in starts])
        y = torch.stack([tr[s + 1:s + seq + 1] for s in starts])
        logits, aux = model(x)
        loss = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        (loss + c["aux"] * aux).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), c["clip"])
        opt.step()
        run = loss.item() if step == 0 else 0.98 * run + 0.02 * loss.item()
        step += 1
        if bench:
            if step == 1:
                t0 = time.time()
            continue
        el = time.time() - t0
        frac = el / budget
        if step % c["eval_every"] == 0 or step == 1 or frac >= 1.0:
            say("step %5d  train %.3f  held-out %.3f  aux %.3f  lr %.2e  %5.0fs  %.0f tok/s" %
                (step, run, evaluate(model, ho, seq, c["eval_windows"]), aux.item(), lr, el, step * B * seq / el))
            save()
    el = time.time() - t0
    if bench:
        print("bench: %d steps of %d tokens after the first: %.2fs/step, %.0f tok/s; params %d" %
              (step - 1, B * seq, el / (step - 1), (step - 1) * B * seq / el, nparams))
        return
    say("done: %d steps (%d tokens, %.2f epochs) in %.0fs (%.1f min)" %
        (step, step * B * seq, step * B * seq / len(tr), el, el / 60))


def eval_ref(d):
    """Greedy continuations of d/prompts.json on d's weights: per step the top-1/top-2 gap and the top 8 [id, logit]."""
    with open(os.path.join(d, "hparams.json")) as f:
        h = json.load(f)
    model = Model(h, h["vocab"])
    model.load(load_weights(d))
    model.eval()
    with open(os.path.join(d, "prompts.json")) as f:
        prompts = json.load(f)
    out = []
    for p in prompts:
        ids = list(p["tokens"])
        gaps, tops = [], []
        with torch.no_grad():
            for _ in range(p["n"]):
                logits, _ = model(torch.tensor([ids]))
                last = logits[0, -1].double()
                top = torch.topk(last, 8)
                gaps.append(float(top.values[0] - top.values[1]))
                tops.append([[int(i), round(float(v), 5)] for v, i in zip(top.values, top.indices)])
                ids.append(int(top.indices[0]))
        out.append({"prompt": p["prompt"], "tokens": p["tokens"], "greedy": ids[len(p["tokens"]):], "gaps": gaps,
                    "top": tops})
    with open(os.path.join(d, "torch_ref.json"), "w") as f:
        json.dump(out, f, indent=1)
    print("wrote", os.path.join(d, "torch_ref.json"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", help="training folder (demomodel prep's output)")
    ap.add_argument("--selftest", action="store_true")
    ap.add_argument("--bench", type=int, default=0, help="time this many steps and stop")
    ap.add_argument("--minutes", type=float, default=TRAIN["minutes"], help="wall-clock budget of the training")
    ap.add_argument("--eval", metavar="DIR2", help="write DIR2/torch_ref.json from DIR2's dequantized weights")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.selftest:
        selftest()
        return
    if a.eval:
        eval_ref(a.eval)
        return
    if not a.dir:
        ap.error("--dir is required")
    c = dict(TRAIN)
    c["minutes"] = a.minutes
    train(a.dir, c, a.bench)


if __name__ == "__main__":
    main()
