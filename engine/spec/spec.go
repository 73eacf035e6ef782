// Package spec holds the draft side of lossless speculative decoding
// (issue 19): a drafter proposes up to k next tokens, the model verifies
// them in one Forward of k+1 rows (the last accepted token, then the
// drafts), and the decode keeps the longest prefix of drafts that equals
// what it would have chosen from each row's logits, plus the token chosen
// from the first row that disagrees (or from the last row). On a swarm
// one forward pays one chain of expert round trips, so a step yields up to
// k+1 tokens for the price of one.
//
// Exactness: row i's logits in a k+1-row Forward are bit-identical to a
// one-row-at-a-time decode's (engine/model's batch invariance), and the
// caller chooses each token with its own sampler from those logits in
// token order, one draw per emitted token, exactly as plain decoding
// does; rows after the first disagreement are discarded without a draw.
// So greedy output is identical, and with temperature > 0 the draws, and
// thus the tokens for a given seed, are identical too: for a drafter that
// proposes one token per position (a point mass, as both drafters here
// are), "sample from the target and accept the draft if they agree" is
// speculative sampling's accept/resample rule (accept d with probability
// p(d); else draw from p without d, renormalised), so no draft changes the
// output distribution. The sequence is checkpointed before the
// verification Forward and truncated to the kept rows afterwards
// (model.Sequence.Checkpoint, Truncate), which restores recurrent state
// exactly.
package spec

import "fmt"

// Mode is where drafts come from: ModeNone, ModeNGram or ModeMTP.
type Mode string

const (
	// ModeNone: no drafts, one token per forward (plain decoding).
	ModeNone Mode = "none"
	// ModeNGram: prompt lookup (NGram): the continuation of the latest
	// earlier occurrence of the last 3, 2 or 1 tokens in prompt + output.
	ModeNGram Mode = "ngram"
	// ModeMTP: the model's multi-token-prediction head (qwen35moe's
	// nextn_predict_layers block), run on the last hidden state.
	ModeMTP Mode = "mtp"
)

// DefaultMax is the default number of draft tokens per step (--draft-max).
const DefaultMax = 8

// MaxMax bounds --draft-max and serve's draft_max: a verification forward
// runs draft-max + 1 rows, and beyond a few dozen drafts nearly every one
// is rejected anyway.
const MaxMax = 64

// ParseMode reads "none", "ngram" or "mtp", spelled exactly so ("" is
// none); other values, "MTP" or " ngram" among them, fail with an error
// naming them (serve's field values are as exact as its field names).
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case "", ModeNone:
		return ModeNone, nil
	case ModeNGram, ModeMTP:
		return m, nil
	}
	return ModeNone, fmt.Errorf("draft mode %q: want none, ngram or mtp", s)
}

// MaxNGram is the longest suffix NGram matches.
const MaxNGram = 3

// NGram is prompt-lookup drafting: for n = MaxNGram down to 1 it looks for
// the latest earlier occurrence of hist's last n tokens in hist and, at the
// first n that has one, returns up to max of the tokens that followed it
// (appended to dst[:0]; the continuation may run into the suffix itself,
// which extends a repeating pattern). It returns dst[:0] when no suffix
// recurs, max <= 0 or hist is shorter than 2 tokens. hist is the prompt's
// tokens followed by the output so far, the last token being the one the
// drafts follow. Cost: O(len(hist) x MaxNGram) comparisons.
func NGram(dst, hist []int32, max int) []int32 {
	dst = dst[:0]
	L := len(hist)
	if max <= 0 || L < 2 {
		return dst
	}
	for n := min(MaxNGram, L-1); n >= 1; n-- {
		suf := hist[L-n:]
	search:
		for j := L - n - 1; j >= 0; j-- {
			for i := range n {
				if hist[j+i] != suf[i] {
					continue search
				}
			}
			return append(dst, hist[j+n:min(L, j+n+max)]...)
		}
	}
	return dst
}

// Stats counts a decode's speculative work.
type Stats struct {
	// Drafted is the draft tokens proposed and verified.
	Drafted int `json:"drafted_tokens"`
	// Accepted is the drafted tokens kept (each equal to what the target
	// model chose at its position).
	Accepted int `json:"accepted_tokens"`
	// Forwards is the decode's forward passes after the prefill (each one
	// chain of expert round trips on a swarm).
	Forwards int `json:"decode_forwards"`
}

// AcceptRate is Accepted / Drafted (0 with no drafts).
func (s Stats) AcceptRate() float64 {
	if s.Drafted == 0 {
		return 0
	}
	return float64(s.Accepted) / float64(s.Drafted)
}
