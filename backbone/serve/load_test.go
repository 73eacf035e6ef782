package serve

import (
	"context"
	"fmt"
	"github.com/kvasir-ai/kvasir/engine/model"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
)

// TestLoad200: 200 concurrent streaming clients send requests back to back
// for a bounded time (4 s; KVASIR_LOAD_SECONDS overrides) against a server
// with 32 slots and a queue of 32. Every response is a complete stream or a
// 429 with Retry-After; afterwards no goroutine is left and the heap is
// back to where it started.
func TestLoad200(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const clients = 200
	dur := 4 * time.Second
	if v := os.Getenv("KVASIR_LOAD_SECONDS"); v != "" {
		if d, err := time.ParseDuration(v + "s"); err == nil {
			dur = d
		}
	}
	m, tok := loadTiny(t)
	m.SetThreads(1)
	chat, _ := ChatTemplateFor(tok, "", "auto")
	reg := prometheus.NewRegistry()
	s, err := New(Config{Model: m, Tokenizer: tok, Chat: chat, ModelID: "tiny", MaxSeqs: 32, QueueSize: 32,
		Registry: reg, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	ts := httptest.NewServer(s.Handler())
	tr := &http.Transport{MaxIdleConnsPerHost: clients, MaxConnsPerHost: clients}
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}

	// Grow the model's buffers to a full step (MaxBatchRows rows) first:
	// they are kept for the model's life and are not a leak.
	warm := make([]model.Row, DefaultMaxBatchRows)
	wseq := m.NewSequence()
	for i := range warm {
		warm[i] = model.Row{Seq: wseq, Token: int32(i % m.Params().Vocab), Pos: i, Logits: i == len(warm)-1}
	}
	if err := m.Forward(context.Background(), warm, make([]float32, m.Params().Vocab)); err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var peak atomic.Uint64
	stopSampling := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopSampling:
				return
			case <-tick.C:
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				if ms.HeapAlloc > peak.Load() {
					peak.Store(ms.HeapAlloc)
				}
			}
		}
	}()

	var ok, busy, bad atomic.Int64
	var firstBad atomic.Value
	ctx, cancel := context.WithTimeout(context.Background(), dur)
	defer cancel()
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				body := fmt.Sprintf(`{"model":"tiny","prompt":"client %d request %d says","max_tokens":4,"temperature":0,"stream":true}`, c, i)
				if c%2 == 1 {
					body = fmt.Sprintf(`{"model":"tiny","messages":[{"role":"user","content":"client %d request %d"}],"max_tokens":4,"stream":true}`, c, i)
				}
				path := "/v1/completions"
				if c%2 == 1 {
					path = "/v1/chat/completions"
				}
				// The request itself is not tied to ctx: a request started
				// before the deadline runs to completion.
				resp, err := client.Post(ts.URL+path, "application/json", strings.NewReader(body))
				if err != nil {
					bad.Add(1)
					firstBad.CompareAndSwap(nil, err.Error())
					return
				}
				switch resp.StatusCode {
				case http.StatusOK:
					events, err := sseEvents(resp.Body)
					st, err2 := collectStream(events)
					if err != nil || err2 != nil || !st.done || st.finish == "" {
						bad.Add(1)
						firstBad.CompareAndSwap(nil, fmt.Sprintf("stream: %v %v %+v", err, err2, st))
					} else {
						ok.Add(1)
					}
				case http.StatusTooManyRequests:
					_, _ = io.Copy(io.Discard, resp.Body)
					if resp.Header.Get("Retry-After") == "" {
						bad.Add(1)
						firstBad.CompareAndSwap(nil, "429 without Retry-After")
					}
					busy.Add(1)
					select { // back off briefly (a real client waits Retry-After)
					case <-time.After(time.Duration(100+c%100) * time.Millisecond):
					case <-ctx.Done():
					}
				default:
					b, _ := io.ReadAll(resp.Body)
					bad.Add(1)
					firstBad.CompareAndSwap(nil, fmt.Sprintf("%d %s", resp.StatusCode, b))
				}
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	close(stopSampling)
	sampler.Wait()

	t.Logf("%v: %d completed streams, %d x 429, %d bad; %v generated tokens; peak heap %.1f MB (start %.1f MB)",
		dur, ok.Load(), busy.Load(), bad.Load(), gatherValue(t, reg, "kvasir_serve_generated_tokens_total"),
		float64(peak.Load())/1e6, float64(before.HeapAlloc)/1e6)
	if bad.Load() != 0 {
		t.Errorf("%d failed requests; first: %v", bad.Load(), firstBad.Load())
	}
	if ok.Load() < 32 { // at least one full batch of slots served
		t.Errorf("only %d completed streams", ok.Load())
	}
	if busy.Load() == 0 {
		t.Errorf("no 429 with 200 clients and 64 places")
	}
	if st := s.Stats(); st.Active != 0 || st.Queued != 0 {
		t.Errorf("after the load: %+v", st)
	}
	// Peak heap: the model and 32 sequences' KV caches (4 layers x 64
	// positions x 2 x 512 B for K and V = 256 KiB each) plus 200
	// connections' buffers and uncollected garbage; 128 MB is far above
	// that and far below a leak per request.
	if p := peak.Load(); p > before.HeapAlloc+128<<20 {
		t.Errorf("peak heap %d MB over the start", (p-before.HeapAlloc)>>20)
	}

	ts.Close()
	s.Close()
	tr.CloseIdleConnections()
	// Drop this test's own references (the server and its pool, the
	// client), so that only what something else still holds is counted.
	s, ts, client = nil, nil, nil
	for range 3 {
		runtime.GC()
		time.Sleep(20 * time.Millisecond) // let closed connections' goroutines end
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	// Pooled sequences keep their recurrent state (qwen35moe: StateBytes
	// each, whatever their length) for reuse: up to MaxSeqs of them.
	if pool := uint64(32 * m.StateBytes()); after.HeapAlloc > before.HeapAlloc+16<<20+pool {
		t.Errorf("heap grew from %d to %d bytes (pooled recurrent state may hold %d)", before.HeapAlloc, after.HeapAlloc, pool)
	}
}
