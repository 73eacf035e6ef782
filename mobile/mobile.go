// Package mobile is the gomobile-bindable API of the kvasir worker for the
// native Android and iOS shells (`gomobile bind ./mobile/`). Only bindable
// types cross it: string, int64, bool, error.
//
// Phones run the worker in an explicit mode, never silently in the
// background (mobile OSes suspend background Go code, and app stores
// forbid mining-like background work):
//
//   - ModeForeground: the worker takes work only while the shell's screen
//     is in the foreground. The shell calls SetForeground(false) from
//     onPause / sceneDidEnterBackground and SetForeground(true) on resume.
//   - ModeCharging: the worker takes work only while the device is
//     charging, inside a visible foreground service (Android) or while the
//     app is open (iOS). The shell reports SetCharging from the OS battery
//     broadcasts (ACTION_POWER_CONNECTED / UIDevice batteryState).
//
// When the mode's condition does not hold, the worker stays connected but
// paused and StatsJSON gives the reason. The identity key comes from the
// shell (Android Keystore / iOS Keychain hold the seed; NewKeySeed makes
// one). The SQLite wallet needs cgo and is not used here: StatsJSON counts
// the bytes served in this run and their metered nKVR; the shell persists
// them and shows credits fetched from the gateway.
//
// The package is pure Go: CGO_ENABLED=0 GOOS=android GOARCH=arm64 go build
// ./mobile/ compiles it (and GOOS=ios for the non-main packages).
package mobile

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvasir-ai/kvasir/app/node"
	"github.com/kvasir-ai/kvasir/app/status"
	"github.com/kvasir-ai/kvasir/engine/worker"
	"github.com/kvasir-ai/kvasir/wallet"
	"github.com/kvasir-ai/kvasir/wallet/walletapi"
)

// Modes for Config's "mode".
const (
	ModeForeground = "foreground"
	ModeCharging   = "charging"
)

// Reasons StatsJSON gives while the mode holds the worker paused.
const (
	ReasonBackground  = "paused: the app is in the background"
	ReasonNotCharging = "paused: waiting for the charger"
)

// ErrConfig wraps every configuration error Start returns.
var ErrConfig = errors.New("mobile: bad config")

// ErrRunning is returned by Start while a worker runs.
var ErrRunning = errors.New("mobile: already running; call Stop first")

// config is Start's JSON.
type config struct {
	GatewayURL string `json:"gateway_url"`  // wss://host:port
	CAPEM      string `json:"ca_pem"`       // extra root CAs (PEM); "" = system roots
	SliceDir   string `json:"slice_dir"`    // expert slice folder in the app's files
	KeySeedHex string `json:"key_seed_hex"` // 64 hex chars: the ed25519 seed (RFC 8032)
	Threads    int    `json:"threads"`      // 0 = all CPUs
	QuotaBytes int64  `json:"quota_bytes"`  // > 0: keep slice_dir (may start empty) and download the backbone's assignment within it
	Mode       string `json:"mode"`         // ModeForeground or ModeCharging
}

type run struct {
	w       *worker.Worker
	ctl     *status.Control
	slice   *node.Slice
	cancel  context.CancelFunc
	done    chan struct{}
	meter   *status.Meter
	address string
	mode    string
	fg, chg bool
	served  atomic.Uint64
}

var (
	mu  sync.Mutex
	cur *run
)

// loadSlice is the slice loader (node's registered one; tests replace it).
var loadSlice = func(dir string, threads int) (*node.Slice, error) { return node.LoadSlice(dir, threads) }

// Start starts the worker with the JSON config (see the package doc for
// the fields: gateway_url, ca_pem, slice_dir, key_seed_hex, threads,
// mode). The shell is assumed in the foreground and not charging until it
// says otherwise. Errors wrap ErrConfig (bad JSON, URL, key, CA, mode,
// slice) or are ErrRunning.
func Start(configJSON string) error {
	var c config
	if err := json.Unmarshal([]byte(configJSON), &c); err != nil {
		return fmt.Errorf("%w: %v", ErrConfig, err)
	}
	if c.Mode == "" {
		c.Mode = ModeForeground
	}
	if c.Mode != ModeForeground && c.Mode != ModeCharging {
		return fmt.Errorf("%w: mode %q, want %q or %q", ErrConfig, c.Mode, ModeForeground, ModeCharging)
	}
	seed, err := hex.DecodeString(c.KeySeedHex)
	if err != nil || len(seed) != ed25519.SeedSize {
		return fmt.Errorf("%w: key_seed_hex must be %d hex characters", ErrConfig, 2*ed25519.SeedSize)
	}
	var pool *x509.CertPool
	if c.CAPEM != "" {
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(c.CAPEM)) {
			return fmt.Errorf("%w: ca_pem holds no certificate", ErrConfig)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if cur != nil {
		return ErrRunning
	}
	if c.QuotaBytes < 0 {
		return fmt.Errorf("%w: quota_bytes %d", ErrConfig, c.QuotaBytes)
	}
	key := ed25519.NewKeyFromSeed(seed)
	r := &run{slice: &node.Slice{}, meter: status.NewMeter(64), mode: c.Mode, fg: true,
		address: wallet.Address(key.Public().(ed25519.PublicKey))}
	wc := worker.Config{GatewayURL: c.GatewayURL, Key: key, RootCAs: pool, Backend: "cpu", Threads: c.Threads,
		OnServed: func(_ string, in, out uint64) { r.served.Add(in + out) }}
	if c.QuotaBytes > 0 {
		wc.SliceDir, wc.Quota = c.SliceDir, c.QuotaBytes
	} else {
		sl, err := loadSlice(c.SliceDir, c.Threads)
		if err != nil {
			return fmt.Errorf("%w: slice: %v", ErrConfig, err)
		}
		r.slice = sl
		wc.Computer, wc.Holdings, wc.ModelID, wc.Backend = sl.Computer, sl.Holdings, sl.ModelID, sl.Backend
	}
	var err2 error
	r.w, err2 = worker.New(wc)
	if err2 != nil {
		if r.slice.Close != nil {
			r.slice.Close()
		}
		return fmt.Errorf("%w: %v", ErrConfig, err2)
	}
	r.ctl = status.NewControl(adapter{r.w})
	r.applyMode()
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done = cancel, make(chan struct{})
	go func() { defer close(r.done); _ = r.w.Run(ctx) }()
	cur = r
	return nil
}

// applyMode pauses or resumes per the mode; mu held.
func (r *run) applyMode() {
	switch {
	case r.mode == ModeForeground && !r.fg:
		r.ctl.SetLimit(ReasonBackground)
	case r.mode == ModeCharging && !r.chg:
		r.ctl.SetLimit(ReasonNotCharging)
	default:
		r.ctl.SetLimit("")
	}
}

// SetForeground tells whether the shell's UI is in the foreground.
func SetForeground(on bool) {
	mu.Lock()
	defer mu.Unlock()
	if cur != nil {
		cur.fg = on
		cur.applyMode()
	}
}

// SetCharging tells whether the device is charging.
func SetCharging(on bool) {
	mu.Lock()
	defer mu.Unlock()
	if cur != nil {
		cur.chg = on
		cur.applyMode()
	}
}

// Pause stops taking work until Resume (the owner's choice; the mode may
// still hold the worker after Resume).
func Pause() { withRun(func(r *run) { r.ctl.Pause() }) }

// Resume withdraws Pause.
func Resume() { withRun(func(r *run) { r.ctl.Resume() }) }

func withRun(f func(*run)) {
	mu.Lock()
	defer mu.Unlock()
	if cur != nil {
		f(cur)
	}
}

// Stop stops the worker and waits for it (at most a few seconds: the
// connection is closed). It does nothing when not running.
func Stop() {
	mu.Lock()
	r := cur
	cur = nil
	mu.Unlock()
	if r == nil {
		return
	}
	r.cancel()
	<-r.done
	r.w.Close()
	if r.slice.Close != nil {
		r.slice.Close()
	}
}

// stats is StatsJSON's object.
type stats struct {
	Running     bool    `json:"running"`
	State       string  `json:"state"` // offline, dialing, connected, paused
	Reason      string  `json:"reason,omitempty"`
	Mode        string  `json:"mode,omitempty"`
	Address     string  `json:"address,omitempty"`
	Gateway     string  `json:"gateway,omitempty"`
	RTTMillis   float64 `json:"rtt_ms"`
	Rows        uint64  `json:"rows"`
	Requests    uint64  `json:"requests"`
	BytesIn     uint64  `json:"bytes_in"`
	BytesOut    uint64  `json:"bytes_out"`
	RowsPerSec  float64 `json:"rows_per_s"` // over the last 10 s of StatsJSON calls
	MBPerSec    float64 `json:"mb_per_s"`   // 10^6 bytes per second, same window
	BytesServed uint64  `json:"bytes_served"`
	MeteredNKVR uint64  `json:"metered_nkvr"` // bytes_served x the default rate (an estimate; credits come from the gateway)
	// Download progress of the assignment (quota_bytes > 0).
	DownloadBytesDone    uint64 `json:"download_bytes_done"`
	DownloadBytesTotal   uint64 `json:"download_bytes_total"`
	DownloadExpertsDone  int    `json:"download_experts_done"`
	DownloadExpertsTotal int    `json:"download_experts_total"`
	Session              string `json:"session,omitempty"`
	LastError            string `json:"last_error,omitempty"`
}

// StatsJSON returns the worker's state as a JSON object: running, state,
// reason, mode, address, gateway, rtt_ms, rows, requests, bytes_in,
// bytes_out, rows_per_s, mb_per_s, bytes_served, metered_nkvr,
// download_bytes_done/_total, download_experts_done/_total, session,
// last_error. Poll it about once a second for the rates.
func StatsJSON() string {
	mu.Lock()
	r := cur
	var s status.Snapshot
	if r != nil {
		s = r.ctl.Stats()
	}
	mu.Unlock()
	out := stats{State: status.Offline.String()}
	if r != nil {
		r.meter.Add(time.Now(), s)
		rows, bytes := r.meter.Rate(10 * time.Second)
		served := r.served.Load()
		nkvr, _ := walletapi.NKVR(served, walletapi.DefaultRateNKVRPerByte)
		out = stats{Running: true, State: s.State.String(), Reason: s.Reason, Mode: r.mode, Address: r.address,
			Gateway: s.Gateway, RTTMillis: float64(s.RTT) / float64(time.Millisecond), Rows: s.Rows, Requests: s.Requests,
			BytesIn: s.BytesIn, BytesOut: s.BytesOut, RowsPerSec: rows, MBPerSec: bytes / status.BytesPerMB,
			BytesServed: served, MeteredNKVR: nkvr, Session: s.Session, LastError: s.LastError,
			DownloadBytesDone: s.DownloadBytesDone, DownloadBytesTotal: s.DownloadBytesTotal,
			DownloadExpertsDone: s.DownloadExpertsDone, DownloadExpertsTotal: s.DownloadExpertsTotal}
	}
	b, _ := json.Marshal(out)
	return string(b)
}

// NewKeySeed returns a fresh random ed25519 seed as 64 hex characters, for
// the shell to keep in the platform key store.
func NewKeySeed() string {
	seed := make([]byte, ed25519.SeedSize)
	if _, err := rand.Read(seed); err != nil {
		return ""
	}
	return hex.EncodeToString(seed)
}

// AddressOf returns the wallet address of a seed (see wallet.Address), or
// an error wrapping ErrConfig for a malformed seed.
func AddressOf(keySeedHex string) (string, error) {
	seed, err := hex.DecodeString(keySeedHex)
	if err != nil || len(seed) != ed25519.SeedSize {
		return "", fmt.Errorf("%w: key_seed_hex must be %d hex characters", ErrConfig, 2*ed25519.SeedSize)
	}
	return wallet.Address(ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey)), nil
}

// adapter makes a worker a status.Source.
type adapter struct{ w *worker.Worker }

func (a adapter) Stats() status.Snapshot { return node.FromWorker(a.w.Stats()) }
func (a adapter) Pause()                 { a.w.Pause() }
func (a adapter) Resume()                { a.w.Resume() }
func (a adapter) FinishThenPause()       { a.w.FinishThenPause() }
