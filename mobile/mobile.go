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
// one).
//
// The worker runs as the desktop app's node (app/node): the same SQLite
// wallet file, in the folder the shell names (data_dir, e.g. the app's
// files directory), with the worker's own count per session, the
// gateway's signed credit statements fetched every 30 s, payouts and the
// reconciliation. WalletJSON reads it (also while stopped), HistoryJSON
// groups the history per hour, day or session, EventsJSON gives the rows.
//
// The package is pure Go: without cgo the wallet uses modernc.org/sqlite
// (wallet/dbfile), so CGO_ENABLED=0 GOOS=android GOARCH=arm64 go build
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
	"io"
	"path/filepath"
	"sync"
	"time"

	"github.com/kvasir-ai/kvasir/app/node"
	"github.com/kvasir-ai/kvasir/app/status"
	"github.com/kvasir-ai/kvasir/wallet"
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
	DataDir    string `json:"data_dir"`     // the app's folder for identity.json and wallet.db (required)
	GatewayURL string `json:"gateway_url"`  // wss://host:port
	CAPEM      string `json:"ca_pem"`       // extra root CAs (PEM); "" = system roots
	SliceDir   string `json:"slice_dir"`    // expert slice folder in the app's files
	KeySeedHex string `json:"key_seed_hex"` // 64 hex chars: the ed25519 seed (RFC 8032)
	Threads    int    `json:"threads"`      // 0 = all CPUs
	CPULimit   int    `json:"cpu_limit"`    // percent of the device's CPU time the worker may use, 1-100; 0 or 100 = no limit
	QuotaBytes int64  `json:"quota_bytes"`  // > 0: keep slice_dir (may start empty) and download the backbone's assignment within it
	Mode       string `json:"mode"`         // ModeForeground or ModeCharging
	SyncEveryS int    `json:"sync_every_s"` // how often to fetch credit statements, seconds; 0 = 30
}

type run struct {
	n       *node.Node
	ctl     *status.Control
	cancel  context.CancelFunc
	done    chan struct{}
	meter   *status.Meter
	address string
	dataDir string
	mode    string
	fg, chg bool
}

var (
	mu  sync.Mutex
	cur *run
)

// loadSlice is the slice loader (node's registered one; tests replace it).
var loadSlice node.SliceLoader = func(dir string, threads int) (*node.Slice, error) { return node.LoadSlice(dir, threads) }

// Start starts the worker with the JSON config (see the package doc for
// the fields: data_dir, gateway_url, ca_pem, slice_dir, key_seed_hex,
// threads, cpu_limit, quota_bytes, mode, sync_every_s) and opens its wallet in
// data_dir. The shell
// is assumed in the foreground and not charging until it says otherwise.
// Errors wrap ErrConfig (bad JSON, URL, key, CA, mode, data_dir, slice),
// are wallet errors (a corrupt wallet file, another identity's wallet,
// both left untouched), or ErrRunning.
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
	seed, err := parseSeed(c.KeySeedHex)
	if err != nil {
		return err
	}
	if c.DataDir == "" {
		return fmt.Errorf("%w: data_dir (the app's folder for the wallet) is required", ErrConfig)
	}
	if c.GatewayURL == "" {
		return fmt.Errorf("%w: gateway_url is required", ErrConfig)
	}
	var pool *x509.CertPool
	if c.CAPEM != "" {
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(c.CAPEM)) {
			return fmt.Errorf("%w: ca_pem holds no certificate", ErrConfig)
		}
	}
	if c.CPULimit < 0 || c.CPULimit > 100 {
		return fmt.Errorf("%w: cpu_limit %d: want a percent from 1 to 100 (0 or 100: no limit)", ErrConfig, c.CPULimit)
	}
	if c.QuotaBytes < 0 || c.SyncEveryS < 0 {
		return fmt.Errorf("%w: quota_bytes %d, sync_every_s %d", ErrConfig, c.QuotaBytes, c.SyncEveryS)
	}
	mu.Lock()
	defer mu.Unlock()
	if cur != nil {
		return ErrRunning
	}
	n, err := node.Open(node.Config{GatewayURL: c.GatewayURL, RootCAs: pool, SliceDir: c.SliceDir, DataDir: c.DataDir,
		Threads: c.Threads, CPULimit: c.CPULimit, QuotaBytes: uint64(c.QuotaBytes), LoadSlice: loadSlice, SyncEvery: time.Duration(c.SyncEveryS) * time.Second,
		KeyStore: wallet.SeedStore{Seed: seed}, StoreName: "shell", Warn: io.Discard})
	if err != nil {
		if errors.Is(err, node.ErrConfig) {
			return fmt.Errorf("%w: %v", ErrConfig, err)
		}
		return err
	}
	if p := n.Problem(); p != "" {
		n.Close()
		return fmt.Errorf("%w: %s", ErrConfig, p)
	}
	r := &run{n: n, meter: status.NewMeter(64), mode: c.Mode, fg: true, address: n.Identity().Address, dataDir: c.DataDir}
	r.ctl = status.NewControl(n)
	r.applyMode()
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done = cancel, make(chan struct{})
	go func() { defer close(r.done); _ = n.Run(ctx) }()
	cur = r
	return nil
}

func parseSeed(keySeedHex string) ([]byte, error) {
	seed, err := hex.DecodeString(keySeedHex)
	if err != nil || len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("%w: key_seed_hex must be %d hex characters", ErrConfig, 2*ed25519.SeedSize)
	}
	return seed, nil
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
	r.n.Close()
}

// stats is StatsJSON's object.
type stats struct {
	Running    bool    `json:"running"`
	State      string  `json:"state"` // offline, dialing, connected, paused
	Reason     string  `json:"reason,omitempty"`
	Mode       string  `json:"mode,omitempty"`
	Address    string  `json:"address,omitempty"`
	Gateway    string  `json:"gateway,omitempty"`
	RTTMillis  float64 `json:"rtt_ms"`
	Rows       uint64  `json:"rows"`
	Requests   uint64  `json:"requests"`
	BytesIn    uint64  `json:"bytes_in"`
	BytesOut   uint64  `json:"bytes_out"`
	RowsPerSec float64 `json:"rows_per_s"` // over the last 10 s of StatsJSON calls
	MBPerSec   float64 `json:"mb_per_s"`   // 10^6 bytes per second, same window
	// From the wallet (all runs, not just this one):
	BytesServed  uint64 `json:"bytes_served"`  // the worker's own count
	MeteredNKVR  uint64 `json:"metered_nkvr"`  // bytes_served at the current rate: an estimate
	CreditedNKVR uint64 `json:"credited_nkvr"` // confirmed by the gateway's signed statements
	PendingNKVR  uint64 `json:"pending_nkvr"`  // credited, not yet paid
	WalletError  string `json:"wallet_error,omitempty"`
	// Download progress of the assignment (quota_bytes > 0).
	DownloadBytesDone    uint64 `json:"download_bytes_done"`
	DownloadBytesTotal   uint64 `json:"download_bytes_total"`
	DownloadExpertsDone  int    `json:"download_experts_done"`
	DownloadExpertsTotal int    `json:"download_experts_total"`
	// CPU limit in force, percent of the device's CPU time (0: none).
	CPULimit  int    `json:"cpu_limit"`
	Session   string `json:"session,omitempty"`
	LastError string `json:"last_error,omitempty"`
}

// StatsJSON returns the worker's state as a JSON object: running, state,
// reason, mode, address, gateway, rtt_ms, rows, requests, bytes_in,
// bytes_out, rows_per_s, mb_per_s, the wallet's bytes_served,
// metered_nkvr (estimate), credited_nkvr and pending_nkvr,
// download_bytes_done/_total, download_experts_done/_total, cpu_limit
// (percent; 0: none), session, last_error. Poll it about once a second
// for the rates.
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
		out = stats{Running: true, State: s.State.String(), Reason: s.Reason, Mode: r.mode, Address: r.address,
			Gateway: s.Gateway, RTTMillis: float64(s.RTT) / float64(time.Millisecond), Rows: s.Rows, Requests: s.Requests,
			BytesIn: s.BytesIn, BytesOut: s.BytesOut, RowsPerSec: rows, MBPerSec: bytes / status.BytesPerMB,
			Session: s.Session, LastError: s.LastError,
			DownloadBytesDone: s.DownloadBytesDone, DownloadBytesTotal: s.DownloadBytesTotal,
			DownloadExpertsDone: s.DownloadExpertsDone, DownloadExpertsTotal: s.DownloadExpertsTotal, CPULimit: s.CPULimit}
		if sum, err := r.n.Summary(); err != nil {
			out.WalletError = err.Error()
		} else {
			out.BytesServed, out.MeteredNKVR, out.CreditedNKVR, out.PendingNKVR = sum.BytesServed, sum.MeteredNKVR, sum.CreditedNKVR, sum.PendingNKVR
		}
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
	seed, err := parseSeed(keySeedHex)
	if err != nil {
		return "", err
	}
	return wallet.Address(ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey)), nil
}

// withWallet calls f with the wallet in dataDir for the seed: the running
// node's when it uses that folder, else a node opened for the wallet alone
// (no worker) and closed after.
func withWallet(dataDir, keySeedHex string, f func(*node.Node) (any, error)) (string, error) {
	seed, err := parseSeed(keySeedHex)
	if err != nil {
		return "", err
	}
	if dataDir == "" {
		return "", fmt.Errorf("%w: data_dir is required", ErrConfig)
	}
	mu.Lock()
	defer mu.Unlock() // a Start waits: it would open the same file
	n := (*node.Node)(nil)
	if cur != nil && filepath.Clean(cur.dataDir) == filepath.Clean(dataDir) {
		if cur.address != wallet.Address(ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey)) {
			return "", fmt.Errorf("%w: the running worker uses another key for %s", wallet.ErrWrongIdentity, dataDir)
		}
		n = cur.n
	} else {
		n, err = node.Open(node.Config{DataDir: dataDir, KeyStore: wallet.SeedStore{Seed: seed}, StoreName: "shell", Warn: io.Discard})
		if err != nil {
			return "", err
		}
		defer n.Close()
	}
	v, err := f(n)
	if err != nil {
		return "", err
	}
	b, err := json.Marshal(v)
	return string(b), err
}

// WalletJSON returns the wallet in dataDir for the seed as `kvasir wallet
// --json` prints it (wallet.Summary: address, metered_nkvr (estimate),
// credited_nkvr, paid_nkvr, pending_nkvr, bytes_served, credited_bytes,
// reconcile with mismatch, mismatch_bytes, awaiting_bytes and explanation, and the newest
// 100 history events). It works while the worker runs (the same file) and
// while it is stopped. Errors: ErrConfig for a bad seed or empty dataDir,
// wallet errors (wallet.ErrCorrupt, ErrNewerSchema, ErrWrongIdentity,
// ErrIdentityUnavailable) for a file that is not this identity's wallet.
func WalletJSON(dataDir, keySeedHex string) (string, error) {
	return withWallet(dataDir, keySeedHex, func(n *node.Node) (any, error) { return n.Summary() })
}

// HistoryJSON returns the wallet's history grouped by "hour", "day" or
// "session" (wallet.Group: from, to, session, sessions, metered_bytes,
// metered_nkvr, statements, credited_bytes, credited_nkvr, rejected_bytes,
// payouts, paid_nkvr), newest first, at most limit groups (<= 0: 48), as a
// JSON array. EventsJSON gives the rows of one group.
func HistoryJSON(dataDir, keySeedHex, by string, limit int64) (string, error) {
	g, ok := map[string]wallet.GroupBy{"hour": wallet.ByHour, "day": wallet.ByDay, "session": wallet.BySession}[by]
	if !ok {
		return "", fmt.Errorf("%w: group by %q, want hour, day or session", ErrConfig, by)
	}
	return withWallet(dataDir, keySeedHex, func(n *node.Node) (any, error) { return n.Groups(g, int(limit)) })
}

// EventsJSON returns the history events with a time in [fromUnixMilli,
// toUnixMilli) (0: open), newest first, at most limit (<= 0: all), as a
// JSON array of wallet.Event (time, state metered|credited|paid, session,
// statement, ledger, bytes, rejected_bytes, nkvr, ref).
func EventsJSON(dataDir, keySeedHex string, fromUnixMilli, toUnixMilli, limit int64) (string, error) {
	var from, to time.Time
	if fromUnixMilli != 0 {
		from = time.UnixMilli(fromUnixMilli)
	}
	if toUnixMilli != 0 {
		to = time.UnixMilli(toUnixMilli)
	}
	return withWallet(dataDir, keySeedHex, func(n *node.Node) (any, error) { return n.Events(from, to, int(limit)) })
}
