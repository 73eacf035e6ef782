package credit

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvasir-ai/kvasir/backbone/ledger"
	"github.com/kvasir-ai/kvasir/backbone/pgstore"
)

// HubConfig configures a gateway's crediting from its hub's ledger
// (StartFromHub; the flags of backbone gateway).
type HubConfig struct {
	// Wallets is the wallets store: an SQLite file or a postgres:// URL
	// ("": no crediting).
	Wallets string
	// Hub is the hub's address, "host:port" or a URL.
	Hub string
	// Sign signs each ledger request (the gateway: hub.SignGateway with
	// the shared hub secret).
	Sign func(*http.Request) error
	// RateNKVRPerByte is the price per creditable byte.
	RateNKVRPerByte uint64
	// Every is the ledger polling period.
	Every time.Duration
	// Registry receives the crediting metrics (nil: none).
	Registry prometheus.Registerer
	// Logf receives the log lines.
	Logf func(format string, args ...any)
}

// StartFromHub opens the wallets store and credits from the hub's ledger
// (ledger.Client over HTTP, every request signed by c.Sign)
// every c.Every until ctx is done, and registers the crediting metrics on
// c.Registry. It returns the handlers to mount on the gateway (the wallet
// API at /v1/wallet/; nil when c.Wallets is empty) and a function that
// stops crediting and closes the store. Errors: Open's and the metric
// registration's.
func StartFromHub(ctx context.Context, c HubConfig) (map[string]http.Handler, func(), error) {
	if c.Wallets == "" {
		return nil, func() {}, nil
	}
	base := c.Hub
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	src := &ledger.Client{BaseURL: base, Sign: c.Sign}
	svc, err := Open(Config{Path: c.Wallets, Source: src, RateNKVRPerByte: c.RateNKVRPerByte})
	if err != nil {
		return nil, nil, err
	}
	if c.Registry != nil {
		if err := c.Registry.Register(svc.Collector()); err != nil {
			svc.Close()
			return nil, nil, err
		}
	}
	c.Logf("wallets on %s (%s)", svc.Store().Kind(), pgstore.RedactPath(c.Wallets))
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = svc.Run(ctx, c.Every, c.Logf)
	}()
	stop := func() {
		cancel()
		<-done
		svc.Close()
	}
	return map[string]http.Handler{"/v1/wallet/": svc.Handler(HandlerOptions{})}, stop, nil
}
