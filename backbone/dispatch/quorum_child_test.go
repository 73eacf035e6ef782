package dispatch_test

import (
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/engine/worker"
)

// TestQuorumLiarsFixtureDecode (issue 20): under --verify quorum, a greedy
// decode of the fixture model through a TLS gateway, a hub and three worker
// processes — two honest, one liar — gives the tokens and logits of a local
// decode bit for bit, with row sums (wire 7: a row's sum from one full
// holder, the DIGEST of that sum from another) and, for one liar, per pair
// (Config.NoRowSums), for each liar:
//
//   - always: every result scaled by 1.01;
//   - patient: honest through a spot-check probation (32 results), then 1
//     result in 20 with one float 0.1 % off;
//   - split: correct DIGESTs, but every RESULT with one float 0.1 % off
//     (a sum RESULT: its first sum).
//
// In every case the liar is caught (forfeit, ban) and the gateway credits
// it 0 nKVR, while the honest workers are credited. The backbone computes
// every expert, so disagreements are decided by its own outputs; in the
// backbone-only variants it computes none, and a third holder decides.
func TestQuorumLiarsFixtureDecode(t *testing.T) {
	const name = "tiny-qwen3moe-Q8_0.gguf"
	const steps = 40 // the patient liar's probation (32 results) ends within it with sums too
	prompt := []int32{9707, 11, 1879, 0, 576, 3974, 13876, 38835}
	ref := loadFixture(t, name)
	p := ref.Params()
	wantLogits, wantToks := decode(t, ref, prompt, steps)
	for _, tc := range []struct {
		name         string
		env          map[string]string
		backboneOnly bool // the backbone computes no expert: a third holder decides
		pairs        bool // Config.NoRowSums: every request per pair
	}{
		{"always", map[string]string{"KVASIR_LIE": "always"}, false, false},
		{"patient", map[string]string{"KVASIR_LIE": "after:32:every:20:one"}, false, false},
		{"split", map[string]string{"KVASIR_SPLIT": "1"}, false, false},
		{"patient-backbone-only", map[string]string{"KVASIR_LIE": "after:32:every:20:one"}, true, false},
		{"split-backbone-only", map[string]string{"KVASIR_SPLIT": "1"}, true, false},
		{"patient-pairs", map[string]string{"KVASIR_LIE": "after:32:every:20:one"}, false, true},
		{"split-backbone-only-pairs", map[string]string{"KVASIR_SPLIT": "1"}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bb := loadFixture(t, name)
			local := bb.LocalExperts()
			md := dispatch.Model{ID: name, D: p.Embd, K: p.ExpertsUsed, NLayer: p.Layers, NExpert: p.Experts}
			s, l := ledgerStack(t, md, func(c *dispatch.Config) {
				c.Fallback = local
				c.ExpertHash = func(l, e int) ([32]byte, bool) { return worker.ExpertSHA256(local.Layer(l), e) }
				c.Verify = dispatch.VerifyQuorum
				c.CheckRate = 0 // the default: 1 request in 20 audited against the backbone's outputs
				c.BanFile = filepath.Join(t.TempDir(), "bans.json")
				if tc.backboneOnly {
					c.LocalHeld = func(l, e int) bool { return false }
				}
				c.NoRowSums = tc.pairs
			})
			env := func(key string, extra map[string]string) map[string]string {
				e := map[string]string{"KVASIR_KEY": key, "KVASIR_MODEL": "fixture:" + name, "KVASIR_LAYERS": "0,1,2,3"}
				for k, v := range extra {
					e[k] = v
				}
				return e
			}
			var honestIDs []string
			for range 2 {
				key, id := newKey()
				s.startTrustChild(t, env(key, nil), true)
				honestIDs = append(honestIDs, id)
			}
			liarKey, liarID := newKey()
			liar := s.startTrustChild(t, env(liarKey, tc.env), true)
			s.waitWorkers(t, 3)
			bb.SetExperts(s.disp)
			gotLogits, gotToks := decode(t, bb, prompt, steps)
			for i := range wantToks {
				if gotToks[i] != wantToks[i] {
					t.Fatalf("token %d: swarm %d, local %d", i, gotToks[i], wantToks[i])
				}
			}
			for i := range wantLogits {
				if math.Float32bits(gotLogits[i]) != math.Float32bits(wantLogits[i]) {
					t.Fatalf("logit %d: swarm %v, local %v", i, gotLogits[i], wantLogits[i])
				}
			}
			st := s.disp.Stats()
			if st.Caught != 1 || liar.lies.Load() < 1 || st.QuorumDisputes < 1 || st.Digests == 0 ||
				(tc.backboneOnly && (st.ExpertsLocal != 0 || st.QuorumAsks == 0)) {
				t.Fatalf("caught %d, liar lied %d times, disputes %d, digests %d", st.Caught, liar.lies.Load(), st.QuorumDisputes, st.Digests)
			}
			// Three full holders: with sums every row is a sum group.
			if (st.SumRequests == 0) != tc.pairs {
				t.Fatalf("%d DISPATCH_SUM(_DIGEST)s sent, %d rows", st.SumRequests, st.SumRows)
			}
			if w, ok := workerByID(st, liarID); !ok || w.Connected || !strings.Contains(w.Reason, "verification failed") {
				t.Fatalf("liar %+v", w)
			}
			nkvr := endSessions(t, s, l)
			lb, lrej := ledgerOf(t, l, liarID)
			if nkvr[liarID] != 0 || lb != 0 || lrej == 0 {
				t.Fatalf("liar credited %d nKVR, ledger %d creditable %d rejected", nkvr[liarID], lb, lrej)
			}
			for _, id := range honestIDs {
				if nkvr[id] == 0 {
					t.Fatalf("honest %s credited nothing", id[:8])
				}
			}
			t.Logf("%s: tokens identical; liar lied %d times, caught; %d outputs remote, %d local; %d quorum requests, %d agreed, %d decided locally, %d further asks, %d digests, %d sum requests; honest credited %d and %d nKVR",
				tc.name, liar.lies.Load(), st.ExpertsRemote, st.ExpertsLocal, st.QuorumRequests, st.QuorumAgreed, st.QuorumLocal, st.QuorumAsks, st.Digests, st.SumRequests,
				nkvr[honestIDs[0]], nkvr[honestIDs[1]])
		})
	}
}
