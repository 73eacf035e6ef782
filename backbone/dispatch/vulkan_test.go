package dispatch_test

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/backbone/hub"
	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/vulkan"
	"github.com/kvasir-ai/kvasir/engine/worker"
)

// vulkanDevice returns the Vulkan device to test on, or skips:
// $KVASIR_VULKAN_DEVICE when set (scripts/gpu-check.sh sets it), else the
// GPU "auto" would take, else the first device (lavapipe on a machine
// without a GPU).
func vulkanDevice(t *testing.T) vulkan.Device {
	t.Helper()
	devs, err := vulkan.Devices()
	if err != nil || len(devs) == 0 {
		t.Skipf("no Vulkan device (%v): install mesa-vulkan-drivers for lavapipe", err)
	}
	if v := os.Getenv("KVASIR_VULKAN_DEVICE"); v != "" {
		i, err := strconv.Atoi(v)
		if err != nil || i < 0 || i >= len(devs) {
			t.Fatalf("KVASIR_VULKAN_DEVICE=%q: want 0..%d", v, len(devs)-1)
		}
		return devs[i]
	}
	if d, ok := vulkan.Pick(devs); ok {
		return d
	}
	return devs[0]
}

// vulkanExperts returns a Vulkan Computer (vulkanDevice) over local, and
// its HELLO backend name, or skips.
func vulkanExperts(t *testing.T, local *expert.Local) (*vulkan.Computer, string) {
	t.Helper()
	dev := vulkanDevice(t)
	c, err := vulkan.New(local, vulkan.Options{Device: dev.Index, Logf: t.Logf})
	if err != nil {
		t.Skipf("vulkan: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c, vulkan.BackendName(dev)
}

// scaledBy is a Computer whose outputs are inner's times f after its
// first honest calls.
type scaledBy struct {
	inner  expert.Computer
	f      float32
	honest int64
	calls  atomic.Int64
}

func (c *scaledBy) ComputeExperts(ctx context.Context, layer int, hidden []float32, ids []int32, n, k int, out []float32) error {
	if err := c.inner.ComputeExperts(ctx, layer, hidden, ids, n, k, out); err != nil {
		return err
	}
	if c.calls.Add(1) <= c.honest {
		return nil
	}
	for i := range out {
		out[i] *= c.f
	}
	return nil
}

// TestVulkanWorkerDecode: a worker computing every expert of the fixture
// models on a Vulkan device, declaring "vulkan:<device>", serves a greedy
// decode whose tokens equal the local decode's and whose logits have a
// cosine >= 0.9999 with the local ones at every step, with every result
// checked (within the default tolerance) and accepted, and the hub's
// creditable bytes exactly the worker's DISPATCH and RESULT bytes; the
// same worker with its
// outputs scaled by 1.01 (after 8 honest results) is caught, banned and
// its session's bytes forfeited, and the decode still equals the local one
// (the reference replaces its result).
func TestVulkanWorkerDecode(t *testing.T) {
	for _, name := range []string{"tiny-qwen3moe-Q8_0.gguf", "tiny-qwen3moe-Q4_K_M.gguf"} {
		for _, liar := range []bool{false, true} {
			sub := name
			if liar {
				sub += "/scaled-1.01"
			}
			t.Run(sub, func(t *testing.T) {
				p, wantLogits, wantToks := localDecode(t, name, 6)
				bb, md, own := fixtureBackbone(t, name)
				s := newStackHub(t, md, 0, func(c *dispatch.Config) {
					own(c)
					c.Probation, c.CheckRate = 1000, 1 // check every result
					// Every output must come from the worker: a loaded test
					// machine (lavapipe is a CPU rasterizer) must not turn a
					// slow answer into a local recomputation (the deadlines
					// are tested elsewhere).
					c.MinDeadline = 2 * time.Second
				}, func(c *hub.Config) {
					// The hub command's settling: what the worker earned is
					// still unsettled when its lie is caught.
					c.SettleDelay, c.SettleResults = hub.DefaultSettleDelay, hub.DefaultSettleResults
				})
				wl := loadFixture(t, name).LocalExperts() // the worker's own copy
				gpu, backend := vulkanExperts(t, wl)
				var comp expert.Computer = gpu
				if liar {
					comp = &scaledBy{inner: gpu, f: 1.01, honest: 8} // earns first, so that it has something to forfeit
				}
				var servedIn, servedOut atomic.Uint64 // DISPATCH and RESULT bytes, as the worker counts them
				s.startInProc(t, comp, worker.HoldingsOf(wl, nil), func(c *worker.Config) {
					c.Backend = backend
					c.OnServed = func(_ string, in, out uint64) { servedIn.Add(in); servedOut.Add(out) }
				})
				s.waitWorkers(t, 1)
				gotLogits, gotToks := s.swarmDecode(t, bb, wantToks)
				// Logits of every step against the local decode's.
				worst, worstStep := 1.0, 0
				for step := range wantToks {
					a, b := gotLogits[step*p.Vocab:(step+1)*p.Vocab], wantLogits[step*p.Vocab:(step+1)*p.Vocab]
					var ab, aa, bb2 float64
					for i := range a {
						ab += float64(a[i]) * float64(b[i])
						aa += float64(a[i]) * float64(a[i])
						bb2 += float64(b[i]) * float64(b[i])
					}
					if c := ab / math.Sqrt(aa*bb2); !(c >= worst) {
						worst, worstStep = c, step
					}
				}
				t.Logf("logits cosine vs the local decode: worst %.7f (step %d)", worst, worstStep)
				if !(worst >= 0.9999) {
					t.Fatalf("logits cosine %.7f at step %d, want >= 0.9999", worst, worstStep)
				}
				st := s.disp.Stats()
				t.Logf("%s: tokens %v; checks %d mismatches %d caught %d; remote %d local %d",
					backend, gotToks, st.Checks, st.Mismatches, st.Caught, st.ExpertsRemote, st.ExpertsLocal)
				if liar {
					if st.Mismatches == 0 || st.Caught != 1 || st.Banned != 1 {
						t.Fatalf("scaled worker: mismatches %d caught %d banned %d, want it caught and banned", st.Mismatches, st.Caught, st.Banned)
					}
					// The hub forfeits what its session had metered.
					waitUntil(t, 10*time.Second, "the scaled worker's session forfeited", func() bool {
						for _, ss := range s.hub.Sessions() {
							if ss.Forfeited > 0 {
								return true
							}
						}
						return false
					})
					return
				}
				want := uint64((len(fixturePrompt) + 5) * p.ExpertsUsed * p.Layers)
				if st.Mismatches != 0 || st.Checks == 0 || st.ExpertsRemote != want || st.ExpertsLocal != 0 {
					t.Fatalf("checks %d mismatches %d remote %d local %d (want %d remote)", st.Checks, st.Mismatches, st.ExpertsRemote, st.ExpertsLocal, want)
				}
				if gs := gpu.Stats(); gs.GPUPairs == 0 || gs.Fault != "" {
					t.Fatalf("vulkan stats %+v", gs)
				}
				// Metering is exact: the hub's creditable bytes are the
				// worker's DISPATCH and RESULT bytes, every RESULT accepted.
				waitUntil(t, 10*time.Second, "every verdict at the hub", func() bool {
					ss := s.hub.Sessions()
					return len(ss) == 1 && ss[0].Pending == 0 && ss[0].CreditIn == servedOut.Load()
				})
				ss := s.hub.Sessions()[0]
				if ss.CreditOut != servedIn.Load() || ss.CreditIn != servedOut.Load() || ss.Rejected != 0 || ss.Forfeited != 0 {
					t.Fatalf("hub metered %d out / %d in creditable (%d rejected), worker served %d in / %d out",
						ss.CreditOut, ss.CreditIn, ss.Rejected, servedIn.Load(), servedOut.Load())
				}
			})
		}
	}
}

// TestVulkanProvisionedWorker: a provisioned worker (an empty slice
// folder and a quota: the backbone assigns every expert of the fixture,
// the worker downloads them) whose store hands its experts to a Vulkan
// device as they arrive, declaring "vulkan:<device>", serves every expert
// of a greedy decode whose tokens equal the local decode's, every result
// checked within the tolerance and none refused. With a device that fails
// at its first submission (an injected lost device) the same decode is
// answered from the CPU path: same tokens, no mismatch, the fault
// recorded and no pair computed on the device.
func TestVulkanProvisionedWorker(t *testing.T) {
	for _, fault := range []bool{false, true} {
		name := "device"
		if fault {
			name = "device-lost"
		}
		t.Run(name, func(t *testing.T) {
			dev := vulkanDevice(t)
			s := newProvStack(t, func(c *dispatch.Config) { c.Probation, c.CheckRate = 1000, 1 })
			p := s.bb.Params()
			_, _, wantToks := localDecode(t, provFixture, 6)
			opt := vulkan.Options{Device: dev.Index, Logf: t.Logf}
			if fault {
				opt.InjectFault = func() error { return errors.New("VK_ERROR_DEVICE_LOST (injected)") }
			}
			gpu, err := vulkan.Open(opt)
			if err != nil {
				t.Skipf("vulkan: %v", err)
			}
			t.Cleanup(func() { gpu.Close() }) // after the worker's own cleanup (Close)
			w := s.startInProc(t, nil, nil, func(c *worker.Config) {
				c.SliceDir, c.Quota, c.Accelerator = filepath.Join(t.TempDir(), "slice"), 64<<20, gpu
				c.Backend, c.ModelID = vulkan.BackendName(dev), ""
			})
			n := p.Layers * p.Experts
			waitUntil(t, 60*time.Second, "the download", func() bool {
				ws, ok := workerStats(s.stack, w.id)
				return ok && ws.Holdings == n
			})
			if gs := gpu.Stats(); gs.ResidentExperts != n {
				t.Fatalf("device stats %+v after the download, want all %d experts resident", gs, n)
			}
			_, gotToks := s.swarmDecode(t, s.bb, wantToks)
			st := s.disp.Stats()
			ws, _ := workerStats(s.stack, w.id)
			gs := gpu.Stats()
			t.Logf("backend %q: tokens %v; checks %d mismatches %d; remote %d local %d; device %+v",
				ws.Backend, gotToks, st.Checks, st.Mismatches, st.ExpertsRemote, st.ExpertsLocal, gs)
			want := uint64((len(fixturePrompt) + 5) * p.ExpertsUsed * p.Layers)
			if ws.Backend != vulkan.BackendName(dev) || st.Mismatches != 0 || st.Caught != 0 || st.Checks == 0 ||
				st.ExpertsRemote != want || st.ExpertsLocal != 0 {
				t.Fatalf("backend %q, checks %d mismatches %d caught %d remote %d local %d (want %d remote)", ws.Backend,
					st.Checks, st.Mismatches, st.Caught, st.ExpertsRemote, st.ExpertsLocal, want)
			}
			if fault {
				if !strings.Contains(gs.Fault, "DEVICE_LOST") || gs.GPUPairs != 0 || gs.CPUPairs == 0 {
					t.Fatalf("device stats %+v: want the fault recorded and every pair on the CPU", gs)
				}
			} else if gs.GPUPairs == 0 || gs.CPUPairs != 0 || gs.Fault != "" {
				t.Fatalf("device stats %+v: want every pair on the device", gs)
			}
		})
	}
}
