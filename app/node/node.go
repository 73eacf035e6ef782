// Package node assembles a contributor node from the real parts: the
// worker identity and local wallet (package wallet), the expert slice on
// disk, and the dial-out worker (engine/worker), whose every RESULT is
// counted in the wallet (OnServed) and whose credits are fetched from the
// gateway periodically (wallet.Sync). The desktop window, headless mode
// and (through a thinner path) the mobile API drive a node through the
// status.Source methods. It does not import Fyne.
package node

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvasir-ai/kvasir/app/status"
	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/slice"
	"github.com/kvasir-ai/kvasir/engine/vulkan"
	"github.com/kvasir-ai/kvasir/engine/wire"
	"github.com/kvasir-ai/kvasir/engine/worker"
	"github.com/kvasir-ai/kvasir/wallet"
)

// Errors returned by Open.
var (
	// ErrConfig: a missing or malformed setting (gateway URL, CA file).
	ErrConfig = errors.New("node: bad configuration")
	// ErrNoSliceLoader: no SliceLoader was configured or registered.
	ErrNoSliceLoader = errors.New("node: no slice loader")
	// ErrBackend: Config.Backend names a device that cannot be had (a
	// malformed value, or "vulkan[:N]" without that device, loader or
	// build); the error wraps ErrConfig too. The app then starts on the
	// CPU and says why.
	ErrBackend = errors.New("node: compute device not available")
)

// Slice is what a worker serves: the expert function over the experts held
// on disk, their holdings (layer, expert, SHA-256) for HELLO, and the facts
// the app shows.
type Slice struct {
	Computer expert.Computer
	Holdings []wire.Holding
	ModelID  string
	Backend  string // e.g. "cpu"
	Info     status.SliceInfo
	Close    func() error // releases the slice (unmaps files); may be nil
}

// SliceLoader opens the slice in dir for threads compute threads (0 = all
// CPUs), verifying the hashes of what it loads; it is supplied by the slice
// package (see RegisterSliceLoader).
type SliceLoader func(dir string, threads int) (*Slice, error)

var (
	loaderMu      sync.Mutex
	defaultLoader SliceLoader
)

// RegisterSliceLoader sets the loader used when Config.LoadSlice is nil.
func RegisterSliceLoader(l SliceLoader) {
	loaderMu.Lock()
	defer loaderMu.Unlock()
	defaultLoader = l
}

// LoadSlice loads dir with the registered loader, or returns
// ErrNoSliceLoader.
func LoadSlice(dir string, threads int) (*Slice, error) {
	loaderMu.Lock()
	l := defaultLoader
	loaderMu.Unlock()
	if l == nil {
		return nil, ErrNoSliceLoader
	}
	return l(dir, threads)
}

// Config configures a Node.
type Config struct {
	GatewayURL string // wss://host[:port]
	CAFile     string // PEM root CAs for the gateway; "" = system roots
	// RootCAs, when set, are the gateway's root CAs instead of CAFile's
	// (a phone shell passes PEM text, not a file).
	RootCAs  *x509.CertPool
	SliceDir string
	DataDir  string // identity record and wallet.db; "" = DefaultDataDir()
	Threads  int    // compute threads; 0 = all CPUs
	// CPULimit keeps the worker's process to this percent of the
	// machine's CPU time, 1-100 (0 or 100: no limit; engine/worker
	// Config.CPULimit); SetCPULimit changes it while the node runs.
	CPULimit int
	// QuotaBytes > 0 turns on slice provisioning: SliceDir (created if
	// needed, may start empty) is kept by the worker (engine/worker
	// Config.SliceDir), which downloads the experts the backbone assigns
	// within this many bytes and serves those that verify. 0 serves the
	// slice directory or GGUF file at SliceDir as it is (LoadSlice).
	QuotaBytes uint64
	// Backend says where the experts are computed, for a slice served as
	// it is and a provisioned one alike: "" or "auto" (a GPU through
	// Vulkan if there is one, else the CPU; a software driver such as
	// lavapipe never), "cpu", or "vulkan[:N]" (engine/vulkan; device N of
	// vulkan.Devices, whatever its kind). The worker declares the device
	// in its HELLO ("vulkan:<device>"). Fixed for the node's life: a new
	// choice needs a new node (Manager.Start).
	Backend string

	LoadSlice SliceLoader     // nil: the registered loader
	KeyStore  wallet.KeyStore // nil: wallet.DefaultKeyStore(DataDir, Warn)
	StoreName string          // label of KeyStore in identity.json; "" = "custom"
	Warn      io.Writer       // keyring fallback warnings; nil = os.Stderr
	Logger    *slog.Logger    // nil = slog.Default()
	SyncEvery time.Duration   // wallet statement sync period; 0 = DefaultSyncEvery
}

// DefaultSyncEvery is how often a node fetches new credit statements from
// the gateway (Config.SyncEvery).
const DefaultSyncEvery = 30 * time.Second

// DataDir returns dir, or DefaultDataDir when dir is "" (a --data flag
// left unset, Config.DataDir empty).
func DataDir(dir string) (string, error) {
	if dir != "" {
		return dir, nil
	}
	return DefaultDataDir()
}

// DefaultDataDir is the app's data folder: os.UserConfigDir()/kvasir.
func DefaultDataDir() (string, error) {
	d, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("%w: no user config folder: %v", ErrConfig, err)
	}
	return filepath.Join(d, "kvasir"), nil
}

// PublicGateway is the network's public gateway, which a first run dials:
// port 443 with a publicly trusted certificate, so no CA file is needed.
const PublicGateway = "wss://gate.kvasir-ai.net:443"

// EnvDefaultGateway names the environment variable that replaces
// PublicGateway as the default (tests point it at a loopback gateway; a
// private deployment can set it for its machines).
const EnvDefaultGateway = "KVASIR_DEFAULT_GATEWAY"

// DefaultQuotaBytes is the disk quota of a first run: the backbone assigns
// up to 4 GB (4 x 10^9 bytes) of experts, downloaded into the slice folder.
const DefaultQuotaBytes = 4_000_000_000

// DefaultGateway returns $KVASIR_DEFAULT_GATEWAY, or PublicGateway.
func DefaultGateway() string {
	if g := os.Getenv(EnvDefaultGateway); g != "" {
		return g
	}
	return PublicGateway
}

// DefaultSliceDir is the slice folder in the app's data folder dataDir.
func DefaultSliceDir(dataDir string) string { return filepath.Join(dataDir, "slice") }

// WithDefaults returns cfg with what a first run needs filled in: the data
// folder (DefaultDataDir), the gateway (DefaultGateway), and, when no slice
// folder is set, DefaultSliceDir with provisioning on (QuotaBytes
// DefaultQuotaBytes unless set), so the worker dials out and asks the
// backbone for experts. A slice folder given without a quota is served as
// it is.
func (cfg Config) WithDefaults() (Config, error) {
	d, err := DataDir(cfg.DataDir)
	if err != nil {
		return cfg, err
	}
	cfg.DataDir = d
	if cfg.GatewayURL == "" {
		cfg.GatewayURL = DefaultGateway()
	}
	if cfg.SliceDir == "" {
		cfg.SliceDir = DefaultSliceDir(cfg.DataDir)
		if cfg.QuotaBytes == 0 {
			cfg.QuotaBytes = DefaultQuotaBytes
		}
	}
	return cfg, nil
}

// Node is a contributor node: identity, wallet, slice and worker. A node
// whose slice could not be loaded still opens (the wallet is readable) and
// reports State Offline with the reason; Run then waits for ctx.
type Node struct {
	cfg     Config
	id      wallet.Identity
	wal     *wallet.Wallet
	slice   *Slice
	info    status.SliceInfo
	w       *worker.Worker
	dev     *vulkan.Computer // the compute device; nil: the CPU
	prov    bool             // provisioning mode (QuotaBytes > 0)
	hc      *http.Client
	base    string    // https://host[:port] of the gateway, for wallet sync
	problem string    // why there is no worker
	opened  time.Time // when Open verified the slice
	log     *slog.Logger

	mu       sync.Mutex
	reason   string    // the worker's last reason, and
	reasonAt time.Time // when Stats first saw it (for the retry countdown)
}

// Open opens the identity and wallet in cfg.DataDir, loads the slice and
// builds the worker. Errors: ErrConfig for a bad gateway URL, CA file or
// CPU limit;
// wallet errors (wallet.ErrCorrupt, wallet.ErrNewerSchema,
// wallet.ErrIdentityUnavailable, ...) as returned. A slice that fails to
// load is not an error (see Node).
func Open(cfg Config) (*Node, error) {
	d, err := DataDir(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	cfg.DataDir = d
	if cfg.SyncEvery <= 0 {
		cfg.SyncEvery = DefaultSyncEvery
	}
	if cfg.CPULimit < 0 || cfg.CPULimit > 100 {
		return nil, fmt.Errorf("%w: CPU limit %d%%: want 1-100 (100: no limit)", ErrConfig, cfg.CPULimit)
	}
	n := &Node{cfg: cfg, log: cfg.Logger, opened: time.Now()}
	if n.log == nil {
		n.log = slog.Default()
	}
	pool := cfg.RootCAs
	workerCAFile := "" // the worker re-reads CAFile at each dial (a rotated gateway certificate needs no restart)
	if pool == nil && cfg.CAFile != "" {
		workerCAFile = cfg.CAFile
		var err error
		switch pool, err = worker.LoadCAFile(cfg.CAFile); {
		case errors.Is(err, worker.ErrNoPEM):
			return nil, fmt.Errorf("%w: CA file %s holds no PEM certificate", ErrConfig, cfg.CAFile)
		case err != nil:
			return nil, fmt.Errorf("%w: CA file: %v", ErrConfig, err)
		}
	}
	if cfg.GatewayURL != "" {
		if err := CheckGatewayURL(cfg.GatewayURL); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrConfig, err)
		}
		u, _ := url.Parse(cfg.GatewayURL)
		scheme := "https"
		if u.Scheme == "ws" {
			scheme = "http"
		}
		n.base = scheme + "://" + u.Host
	}
	n.hc = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}

	ks, storeName := cfg.KeyStore, cfg.StoreName
	if ks == nil {
		warn := cfg.Warn
		if warn == nil {
			warn = os.Stderr
		}
		ks, storeName = wallet.DefaultKeyStore(cfg.DataDir, warn)
	} else if storeName == "" {
		storeName = "custom"
	}
	id, err := wallet.OpenIdentity(cfg.DataDir, ks, storeName)
	if err != nil {
		return nil, err
	}
	n.id = id
	// Credits arrive a settle delay (30 s at the hub) plus a sync period
	// after the work: only older gaps are mismatches.
	n.wal, err = wallet.Open(filepath.Join(cfg.DataDir, "wallet.db"), id, wallet.Options{CreditLag: cfg.SyncEvery + time.Minute})
	if err != nil {
		return nil, err
	}

	n.info = status.SliceInfo{Dir: cfg.SliceDir, QuotaBytes: cfg.QuotaBytes}
	switch {
	case cfg.GatewayURL == "":
		n.problem = "no gateway set (Settings)" // WithDefaults sets one
	case cfg.SliceDir == "":
		n.problem = "no slice: no slice folder set (Settings)"
		n.info.Problem = "no slice folder set"
	case cfg.QuotaBytes > 0:
		if cfg.QuotaBytes > 1<<62 {
			n.Close()
			return nil, fmt.Errorf("%w: quota %d bytes", ErrConfig, cfg.QuotaBytes)
		}
		n.prov = true
		dev, name, err := vulkan.OpenBackend(cfg.Backend, 0, func(f string, a ...any) { n.log.Info(fmt.Sprintf(f, a...)) })
		if err != nil {
			n.Close()
			return nil, fmt.Errorf("%w: %w: backend %q: %v", ErrBackend, ErrConfig, cfg.Backend, err)
		}
		var acc slice.Accelerator
		if dev != nil {
			n.dev, acc = dev, dev
		} else {
			name = "cpu"
		}
		n.w, err = worker.New(worker.Config{GatewayURL: cfg.GatewayURL, Key: id.Key, RootCAs: pool, CAFile: workerCAFile, SliceDir: cfg.SliceDir,
			Quota: int64(cfg.QuotaBytes), Backend: name, Accelerator: acc, Threads: cfg.Threads, CPULimit: cfg.CPULimit, OnServed: n.wal.Served, Logger: n.log})
		if err != nil {
			n.problem = "no slice: " + err.Error()
			n.info.Problem = n.problem
		}
	default:
		load := cfg.LoadSlice
		if load == nil {
			load = LoadSlice // ErrNoSliceLoader without a registered loader
		}
		sl, err := load(cfg.SliceDir, cfg.Threads)
		if err != nil {
			n.problem = "no slice: " + err.Error()
			n.info.Problem = n.problem
			break
		}
		if err := applyBackend(cfg.Backend, sl, func(f string, a ...any) { n.log.Info(fmt.Sprintf(f, a...)) }); err != nil {
			if sl.Close != nil {
				sl.Close()
			}
			n.Close()
			return nil, err
		}
		n.slice = sl
		n.dev, _ = sl.Computer.(*vulkan.Computer) // closed by sl.Close
		n.info = sl.Info
		n.info.Dir, n.info.QuotaBytes = cfg.SliceDir, cfg.QuotaBytes
		n.w, err = worker.New(worker.Config{GatewayURL: cfg.GatewayURL, Key: id.Key, RootCAs: pool, CAFile: workerCAFile,
			Computer: sl.Computer, Holdings: sl.Holdings, ModelID: sl.ModelID, Backend: sl.Backend, Threads: cfg.Threads,
			CPULimit: cfg.CPULimit, OnServed: n.wal.Served, Logger: n.log})
		if err != nil {
			n.Close()
			return nil, fmt.Errorf("%w: %v", ErrConfig, err)
		}
	}
	return n, nil
}

// Problem says why the node has no worker ("" when it has one): no
// gateway, no slice folder, or the slice failed to load.
func (n *Node) Problem() string {
	if n.w != nil {
		return ""
	}
	return n.problem
}

// Identity returns the node's worker identity.
func (n *Node) Identity() wallet.Identity { return n.id }

// Run runs the worker (dial, serve, reconnect) and syncs the wallet's
// statements from the gateway every SyncEvery, until ctx is done. It
// first saves the gateway in the data folder (SaveGateway), for `kvasir
// wallet`. It returns ctx's error.
func (n *Node) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	if n.w != nil && n.cfg.GatewayURL != "" {
		if err := SaveGateway(n.cfg.DataDir, SavedGateway{URL: n.cfg.GatewayURL, CAFile: n.cfg.CAFile}); err != nil {
			n.log.Warn("saving the gateway for `kvasir wallet`", "err", err)
		}
	}
	if n.w != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := n.w.Run(ctx); err != nil && ctx.Err() == nil {
				n.log.Warn("worker stopped", "err", err)
			}
		}()
	}
	if n.base != "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(n.cfg.SyncEvery)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					if _, err := n.wal.Sync(ctx, n.hc, n.base, n.id.Key); err != nil && ctx.Err() == nil {
						// A gateway that cannot be reached says so in the
						// status; a statement refused is worth a line.
						lvl := slog.LevelDebug
						if errors.Is(err, wallet.ErrStatement) || errors.Is(err, wallet.ErrGatewayKey) {
							lvl = slog.LevelWarn
						}
						n.log.Log(ctx, lvl, "wallet sync: statements not taken", "err", err)
					}
				}
			}
		}()
	}
	<-ctx.Done()
	wg.Wait()
	return ctx.Err()
}

// SyncNow fetches new statements from the gateway once.
func (n *Node) SyncNow(ctx context.Context) (int, error) {
	if n.base == "" {
		return 0, fmt.Errorf("%w: no gateway", ErrConfig)
	}
	return n.wal.Sync(ctx, n.hc, n.base, n.id.Key)
}

// Stats implements status.Source: the worker's snapshot, or Offline with
// the reason when the node has no worker.
func (n *Node) Stats() status.Snapshot {
	if n.w == nil {
		return status.Snapshot{State: status.Offline, Reason: n.problem, Device: n.Device()}
	}
	ws := n.w.Stats()
	now := time.Now()
	n.mu.Lock()
	if ws.Reason != n.reason {
		n.reason, n.reasonAt = ws.Reason, now
	}
	since := now.Sub(n.reasonAt)
	n.mu.Unlock()
	s := fromWorker(ws, since)
	s.Device = n.Device()
	return s
}

// Device says where the node computes, for people: "CPU", or the Vulkan
// device's name and "(Vulkan)", or "CPU (the Vulkan device ... failed:
// ...)" after a device fault (engine/vulkan.Describe).
func (n *Node) Device() string { return vulkan.Describe(n.dev) }

// DeviceStats returns the compute device's counters (engine/vulkan.Stats:
// pairs computed on the device and by the CPU path, resident experts, a
// fault) and true, or false when the node computes on the CPU.
func (n *Node) DeviceStats() (vulkan.Stats, bool) {
	if n.dev == nil {
		return vulkan.Stats{}, false
	}
	return n.dev.Stats(), true
}

// FromWorker converts the worker's stats to a status.Snapshot. While the
// worker redials after a failed dial, the reason says in words what failed
// (no network, DNS, refused, TLS, timeout; status.DialReason) and when it
// retries.
func FromWorker(s worker.Stats) status.Snapshot { return fromWorker(s, 0) }

// fromWorker is FromWorker for a reason the worker set since ago: while
// it waits to redial after a failed dial the snapshot is Offline (not
// "connecting") and the retry delay counts down (status.DialReasonAt).
func fromWorker(s worker.Stats, since time.Duration) status.Snapshot {
	st := status.Offline
	switch s.State {
	case worker.StateDialing:
		st = status.Dialing
	case worker.StateConnected:
		st = status.Connected
	case worker.StatePaused:
		st = status.Paused
	}
	reason := s.Reason
	if s.State == worker.StateDialing && strings.HasPrefix(s.LastError, "dial") {
		reason = status.DialReasonAt(s.Gateway, s.Reason, s.LastError, since)
		if s.Reason != "connecting" {
			st = status.Offline // waiting to redial
		}
	}
	if st == status.Connected && reason == "" && s.Quota > 0 && s.Experts == 0 && s.DownloadExpertsTotal == 0 {
		// Connected, but the backbone has assigned nothing to compute:
		// the swarm has enough holders, or the quota is smaller than one
		// expert. The window said "Connected — earning" at 0 rows/s.
		reason = fmt.Sprintf("no experts assigned yet within the %s quota (the swarm may hold every expert already, or one expert is larger than the quota)",
			status.FormatBytes(uint64(s.Quota)))
	}
	rtt := s.RTT
	if s.Session == "" || (st != status.Connected && st != status.Paused) {
		rtt = 0 // the last session's: not a round trip of now
	}
	return status.Snapshot{State: st, Reason: reason, Gateway: s.Gateway, RTT: rtt, Rows: s.Rows,
		Requests: s.Requests, BytesIn: s.BytesIn, BytesOut: s.BytesOut, Session: s.Session,
		ConnectedSince: s.ConnectedSince, LastError: s.LastError,
		DownloadBytesDone: s.DownloadBytesDone, DownloadBytesTotal: s.DownloadBytesTotal,
		DownloadExpertsDone: s.DownloadExpertsDone, DownloadExpertsTotal: s.DownloadExpertsTotal, CPULimit: s.CPULimit}
}

// SetCPULimit changes the worker's CPU limit while it runs (percent of the
// machine's CPU time, 1-100; 0 or 100: none; worker.SetCPULimit): no new
// session. Errors wrap worker.ErrCPULimit. Without a worker it does
// nothing.
func (n *Node) SetCPULimit(pct int) error {
	if n.w == nil {
		return nil
	}
	return n.w.SetCPULimit(pct)
}

// Pause implements status.Source.
func (n *Node) Pause() {
	if n.w != nil {
		n.w.Pause()
	}
}

// Resume implements status.Source.
func (n *Node) Resume() {
	if n.w != nil {
		n.w.Resume()
	}
}

// FinishThenPause implements status.Source.
func (n *Node) FinishThenPause() {
	if n.w != nil {
		n.w.FinishThenPause()
	}
}

// Summary returns the wallet summary (wallet.Wallet.Summary).
func (n *Node) Summary() (wallet.Summary, error) { return n.wal.Summary() }

// Groups returns the wallet history grouped (wallet.Wallet.Groups).
func (n *Node) Groups(by wallet.GroupBy, limit int) ([]wallet.Group, error) {
	return n.wal.Groups(by, limit)
}

// Events returns wallet history events (wallet.Wallet.Events).
func (n *Node) Events(from, to time.Time, limit int) ([]wallet.Event, error) {
	return n.wal.Events(from, to, limit)
}

// Slice returns the slice facts; in provisioning mode, the worker's slice
// store as it is now (experts verified at start or at download).
func (n *Node) Slice() status.SliceInfo {
	if !n.prov || n.w == nil {
		return n.info
	}
	ws := n.w.Stats()
	info := n.info
	info.Experts, info.Bytes, info.Bad = ws.Experts, uint64(max(ws.SliceBytes, 0)), ws.BadExperts
	info.QuotaBytes = uint64(max(ws.Quota, 0))
	info.Layers = 0
	seen := map[uint16]bool{}
	if st := n.w.Store(); st != nil {
		for _, h := range st.Holdings() {
			if !seen[h.Layer] {
				seen[h.Layer] = true
				info.Layers++
			}
		}
	}
	info.Verified, info.VerifiedAt = true, n.opened
	return info
}

// Close flushes and closes the wallet, releases the slice and closes the
// wallet-sync client's idle connections. Call after Run has returned.
func (n *Node) Close() error {
	var err error
	if n.hc != nil {
		n.hc.CloseIdleConnections()
	}
	if n.wal != nil {
		err = n.wal.Close()
	}
	if n.slice != nil && n.slice.Close != nil {
		err = errors.Join(err, n.slice.Close())
	}
	if n.w != nil {
		err = errors.Join(err, n.w.Close())
	}
	if n.prov && n.dev != nil {
		err = errors.Join(err, n.dev.Close()) // after the worker's store emptied it
	}
	return err
}

var _ status.Source = (*Node)(nil)

// SavedGateway is the gateway a node last worked through, kept in its data
// folder (GatewayFile) so that `kvasir wallet` fetches statements from it
// when the worker is not running.
type SavedGateway struct {
	URL    string `json:"gateway_url"`       // wss://host[:port]
	CAFile string `json:"ca_file,omitempty"` // PEM root CAs; "" = system roots
}

// GatewayFile is the file in the data folder that holds the SavedGateway.
const GatewayFile = "gateway.json"

// SaveGateway writes g to dataDir/GatewayFile (mode 0600, replaced
// atomically). A relative g.CAFile is stored as an absolute path (against
// the current directory), so that `kvasir wallet` run from elsewhere finds
// it.
func SaveGateway(dataDir string, g SavedGateway) error {
	if g.CAFile != "" {
		abs, err := filepath.Abs(g.CAFile)
		if err != nil {
			return err
		}
		g.CAFile = abs
	}
	b, err := json.Marshal(g)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dataDir, GatewayFile+".*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), filepath.Join(dataDir, GatewayFile))
}

// LoadGateway reads dataDir/GatewayFile; an error wrapping os.ErrNotExist
// when no node has run in dataDir yet. A relative CA file (saved by a
// kvasir before SaveGateway stored absolute paths; it was relative to the
// directory the worker was started in, which is not known) is resolved
// against the current directory, else the data folder, whichever holds
// the file; if neither does it is returned as saved, and opening a node
// with it fails with ErrConfig.
func LoadGateway(dataDir string) (SavedGateway, error) {
	var g SavedGateway
	b, err := os.ReadFile(filepath.Join(dataDir, GatewayFile))
	if err != nil {
		return g, err
	}
	if err := json.Unmarshal(b, &g); err != nil || g.URL == "" {
		return g, fmt.Errorf("%w: %s: not a saved gateway", ErrConfig, filepath.Join(dataDir, GatewayFile))
	}
	if g.CAFile != "" && !filepath.IsAbs(g.CAFile) {
		for _, dir := range []string{".", dataDir} {
			p, err := filepath.Abs(filepath.Join(dir, g.CAFile))
			if err != nil {
				continue
			}
			if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
				g.CAFile = p
				break
			}
		}
	}
	return g, nil
}

// CheckGatewayURL reports whether raw is a gateway URL a worker may dial:
// wss://host[:port][/path], or ws:// to this machine only (loopback: a
// test gateway or hub), since ws:// carries the worker's signed upgrade
// and its work in clear.
func CheckGatewayURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "wss" && u.Scheme != "ws") || u.Host == "" {
		return fmt.Errorf("gateway URL %q must look like wss://host:443", raw)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("gateway URL %q: port %q: want 1-65535", raw, p)
		}
	}
	if u.Scheme == "ws" {
		h := u.Hostname()
		if ip := net.ParseIP(h); !(h == "localhost" || (ip != nil && ip.IsLoopback())) {
			return fmt.Errorf("gateway URL %q: ws:// sends the worker's identity signature and its work in clear; use wss:// (ws:// is for a gateway on this machine only)", raw)
		}
	}
	return nil
}
