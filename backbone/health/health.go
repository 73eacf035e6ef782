// Package health serves the liveness and readiness endpoints every role
// mounts on its metrics listener (the hub's LAN listener, the gateway's
// --metrics-listen, the backbone's API listener):
//
//	GET /healthz  200 "ok" while the process serves HTTP (liveness)
//	GET /readyz   200 when every readiness check passes, else 503; the body
//	              is JSON: {"ready":bool,"checks":{"name":"ok"|"error text"}}
//
// Checks run on each request, concurrently, each bounded by Timeout.
package health

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Paths of the two endpoints.
const (
	HealthzPath = "/healthz"
	ReadyzPath  = "/readyz"
)

// Timeout bounds one readiness check.
const Timeout = 3 * time.Second

// Check is one readiness condition: Fn returns nil when it is met.
type Check struct {
	Name string
	Fn   func(ctx context.Context) error
}

// Report is the JSON body of /readyz.
type Report struct {
	Ready  bool              `json:"ready"`
	Checks map[string]string `json:"checks"` // name -> "ok" or why not
}

// Run runs every check (concurrently, each within Timeout) and reports.
func Run(ctx context.Context, checks []Check) Report {
	r := Report{Ready: true, Checks: map[string]string{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, c := range checks {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, Timeout)
			defer cancel()
			err := c.Fn(cctx)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				r.Ready = false
				r.Checks[c.Name] = err.Error()
			} else {
				r.Checks[c.Name] = "ok"
			}
		})
	}
	wg.Wait()
	return r
}

// Handlers returns /healthz and /readyz for checks, as http.ServeMux
// patterns (for hub.Config.Extra and the like).
func Handlers(checks ...Check) map[string]http.Handler {
	return map[string]http.Handler{
		HealthzPath: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			_, _ = w.Write([]byte("ok\n"))
		}),
		ReadyzPath: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rep := Run(r.Context(), checks)
			w.Header().Set("Content-Type", "application/json")
			if !rep.Ready {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
			enc := json.NewEncoder(w)
			enc.SetIndent("", "  ")
			_ = enc.Encode(rep)
		}),
	}
}

// Mount adds /healthz and /readyz for checks to mux.
func Mount(mux *http.ServeMux, checks ...Check) {
	hs := Handlers(checks...)
	keys := make([]string, 0, len(hs))
	for k := range hs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		mux.Handle(k, hs[k])
	}
}

// Dial is a check that a TCP connection to addr opens (a peer role
// listening: the hub's backbone, the gateway's hub).
func Dial(name, addr string) Check {
	return Check{Name: name, Fn: func(ctx context.Context) error {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return c.Close()
	}}
}

// Peer is a check that the role at addr (host:port, a hub or a backbone
// listening for HTTP) reports itself ready: GET http://addr/readyz answers
// 200. Another answer fails the check with the peer's own reasons (its
// Report's failing checks), and a peer that does not listen with the dial
// error. A gateway whose hub turns every worker away (its backbone down:
// 503) is then not ready either, where a TCP dial (Dial) said ok.
func Peer(name, addr string) Check {
	return Check{Name: name, Fn: func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+ReadyzPath, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return nil
		}
		var r Report
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(body, &r) != nil || len(r.Checks) == 0 {
			return fmt.Errorf("%s answers %s", ReadyzPath, resp.Status)
		}
		var why []string
		for _, k := range slices.Sorted(maps.Keys(r.Checks)) {
			if v := r.Checks[k]; v != "ok" {
				why = append(why, k+": "+v)
			}
		}
		return fmt.Errorf("not ready (%s)", strings.Join(why, "; "))
	}}
}
