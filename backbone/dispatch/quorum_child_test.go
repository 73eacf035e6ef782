package dispatch_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
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
	_, wantLogits, wantToks := localDecode(t, name, steps)
	for _, tc := range []struct {
		name         string
		env          []string // the liar's KVASIR_... settings, in pairs (childEnv)
		backboneOnly bool     // the backbone computes no expert: a third holder decides
		pairs        bool     // Config.NoRowSums: every request per pair
	}{
		{"always", []string{"KVASIR_LIE", "always"}, false, false},
		{"patient", []string{"KVASIR_LIE", "after:32:every:20:one"}, false, false},
		{"split", []string{"KVASIR_SPLIT", "1"}, false, false},
		{"patient-backbone-only", []string{"KVASIR_LIE", "after:32:every:20:one"}, true, false},
		{"split-backbone-only", []string{"KVASIR_SPLIT", "1"}, true, false},
		{"patient-pairs", []string{"KVASIR_LIE", "after:32:every:20:one"}, false, true},
		{"split-backbone-only-pairs", []string{"KVASIR_SPLIT", "1"}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bb, md, own := fixtureBackbone(t, name)
			s, l := ledgerStack(t, md, func(c *dispatch.Config) {
				own(c)
				c.Verify = dispatch.VerifyQuorum
				c.CheckRate = 0 // the default: 1 request in 20 audited against the backbone's outputs
				c.BanFile = filepath.Join(t.TempDir(), "bans.json")
				if tc.backboneOnly {
					c.LocalHeld = func(l, e int) bool { return false }
				}
				c.NoRowSums = tc.pairs
			})
			var honestIDs []string
			for range 2 {
				key, id := newKey()
				s.startTrustChild(t, childEnv(key, "fixture:"+name), true)
				honestIDs = append(honestIDs, id)
			}
			liarKey, liarID := newKey()
			liar := s.startTrustChild(t, childEnv(liarKey, "fixture:"+name, tc.env...), true)
			s.waitWorkers(t, 3)
			gotLogits, _ := s.swarmDecode(t, bb, wantToks)
			sameLogits(t, gotLogits, wantLogits)
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
