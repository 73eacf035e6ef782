package credit

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvasir-ai/kvasir/backbone/health"
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

// Crediting is a running StartFromHub: the wallet API to mount on the
// gateway, the readiness checks of the crediting, and Stop.
type Crediting struct {
	// Handlers are the wallet API at /v1/wallet/ (nil without wallets).
	Handlers map[string]http.Handler
	// Checks are the gateway's readiness conditions for crediting (nil
	// without wallets): "wallets", the wallets store answers a read
	// (Service.Ping), "ledger", the hub's ledger answers a signed read
	// (Service.PingLedger), and "crediting", the last crediting pass
	// worked (Service.CreditError).
	Checks []health.Check

	stop func()
}

// Stop stops crediting and closes the store; it is safe to call more than
// once.
func (c *Crediting) Stop() {
	if c.stop != nil {
		c.stop()
		c.stop = nil
	}
}

// StartFromHub opens the wallets store and credits from the hub's ledger
// (ledger.Client over HTTP, every request signed by c.Sign) every c.Every
// until ctx is done or Stop, and registers the crediting metrics on
// c.Registry. With c.Wallets empty it does nothing and returns a Crediting
// with no handlers and no checks. Errors: Open's and the metric
// registration's.
func StartFromHub(ctx context.Context, c HubConfig) (*Crediting, error) {
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	if c.Wallets == "" {
		c.Logf("no wallets store (--wallets): this gateway credits no one; the hub's ledger keeps the work for a gateway that does")
		return &Crediting{}, nil
	}
	base := c.Hub
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	src := &ledger.Client{BaseURL: base, Sign: c.Sign}
	svc, err := Open(Config{Path: c.Wallets, Source: src, RateNKVRPerByte: c.RateNKVRPerByte})
	if err != nil {
		return nil, err
	}
	if c.Registry != nil {
		if err := c.Registry.Register(svc.Collector()); err != nil {
			svc.Close()
			return nil, err
		}
	}
	c.Logf("wallets on %s (%s)", svc.Store().Kind(), pgstore.RedactPath(c.Wallets))
	if svc.Created() {
		c.Logf("warning: the wallets store %s is new (a new signing key): it will credit the hub's ledger from its first row. "+
			"If another wallets store already credited this ledger, stop this gateway now and start it on that store: "+
			"its rows would be paid twice, and workers' wallets refuse a gateway key they did not pin", pgstore.RedactPath(c.Wallets))
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = svc.Run(ctx, c.Every, c.Logf)
	}()
	return &Crediting{
		Handlers: map[string]http.Handler{"/v1/wallet/": svc.Handler(HandlerOptions{})},
		Checks:   []health.Check{{Name: "wallets", Fn: svc.Ping}, {Name: "ledger", Fn: svc.PingLedger}, {Name: "crediting", Fn: svc.CreditError}},
		stop: func() {
			cancel()
			<-done
			svc.Close()
		},
	}, nil
}
