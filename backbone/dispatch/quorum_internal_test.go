package dispatch

import (
	"context"
	"testing"
)

type zeroExperts struct{}

func (zeroExperts) ComputeExperts(context.Context, int, []float32, []int32, int, int, []float32) error {
	return nil
}

// TestQuorumPlacementReplicas: under quorum provisioning keeps at least two
// holders of every expert: Replicas is raised to 2 and (in plan) every
// expert is replicated, not only routed ones.
func TestQuorumPlacementReplicas(t *testing.T) {
	m := Model{D: 4, K: 2, NLayer: 1, NExpert: 4}
	for _, c := range []struct {
		verify    VerifyMode
		replicas  int
		want      int
		replicate bool
	}{{VerifySpot, 1, 1, false}, {VerifyQuorum, 1, 2, true}, {VerifyQuorum, 3, 3, true}} {
		d, err := New(Config{Model: m, Fallback: zeroExperts{}, Verify: c.verify, Replicas: c.replicas})
		if err != nil {
			t.Fatal(err)
		}
		if d.cfg.Replicas != c.want || d.quorum() != c.replicate {
			t.Fatalf("%+v: replicas %d, quorum %v", c, d.cfg.Replicas, d.quorum())
		}
	}
}
