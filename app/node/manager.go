package node

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/kvasir-ai/kvasir/app/status"
	"github.com/kvasir-ai/kvasir/wallet"
)

// ErrNotRunning is returned by Manager.Summary when no node is open.
var ErrNotRunning = errors.New("node: not running")

// Manager keeps one running Node and replaces it when the settings change
// (Start again), carrying the owner's pause over. It implements
// status.Source and the app's Backend. Safe for concurrent use.
type Manager struct {
	// startMu serializes Start, so that two overlapping Starts (the app
	// starts one at launch and one per saved setting) cannot both open a
	// node and leave the first running and unreachable.
	startMu sync.Mutex
	mu      sync.Mutex
	n       *Node
	err     error // why the last Start failed
	cancel  context.CancelFunc
	done    chan struct{}
	pause   int // 0 running, 1 paused, 2 finishing then paused
}

// Start stops the running node (if any), opens one for cfg and runs it in
// the background. On error the manager holds no node and Stats reports the
// error as the reason.
func (m *Manager) Start(cfg Config) error {
	m.startMu.Lock()
	defer m.startMu.Unlock()
	m.Stop()
	n, err := Open(cfg)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		m.err = err
		return err
	}
	m.n, m.err = n, nil
	switch m.pause {
	case 1:
		n.Pause()
	case 2:
		n.FinishThenPause()
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel, m.done = cancel, make(chan struct{})
	go func(done chan struct{}) {
		defer close(done)
		_ = n.Run(ctx)
	}(m.done)
	return nil
}

// Stop stops and closes the running node, if any.
func (m *Manager) Stop() {
	m.mu.Lock()
	n, cancel, done := m.n, m.cancel, m.done
	m.n, m.cancel, m.done = nil, nil, nil
	m.mu.Unlock()
	if n == nil {
		return
	}
	cancel()
	<-done
	_ = n.Close()
}

func (m *Manager) node() (*Node, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.n, m.err
}

// Node returns the running node, or nil.
func (m *Manager) Node() *Node { n, _ := m.node(); return n }

// Stats implements status.Source.
func (m *Manager) Stats() status.Snapshot {
	n, err := m.node()
	if n == nil {
		r := "not started"
		if err != nil {
			r = err.Error()
		}
		return status.Snapshot{State: status.Offline, Reason: r}
	}
	return n.Stats()
}

func (m *Manager) setPause(p int) *Node {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pause = p
	return m.n
}

// Pause implements status.Source.
func (m *Manager) Pause() {
	if n := m.setPause(1); n != nil {
		n.Pause()
	}
}

// FinishThenPause implements status.Source.
func (m *Manager) FinishThenPause() {
	if n := m.setPause(2); n != nil {
		n.FinishThenPause()
	}
}

// Resume implements status.Source.
func (m *Manager) Resume() {
	if n := m.setPause(0); n != nil {
		n.Resume()
	}
}

// SetCPULimit changes the running node's CPU limit without restarting it
// (Node.SetCPULimit); with no node it does nothing (the next Start takes
// its Config.CPULimit). Errors wrap worker.ErrCPULimit.
func (m *Manager) SetCPULimit(pct int) error {
	if n, _ := m.node(); n != nil {
		return n.SetCPULimit(pct)
	}
	return nil
}

// Summary returns the running node's wallet summary, or ErrNotRunning
// (wrapping the start error, if any).
func (m *Manager) Summary() (wallet.Summary, error) {
	n, err := m.node()
	if n == nil {
		if err != nil {
			return wallet.Summary{}, errors.Join(ErrNotRunning, err)
		}
		return wallet.Summary{}, ErrNotRunning
	}
	return n.Summary()
}

// Groups returns the running node's grouped wallet history, or
// ErrNotRunning.
func (m *Manager) Groups(by wallet.GroupBy, limit int) ([]wallet.Group, error) {
	n, err := m.node()
	if n == nil {
		return nil, errors.Join(ErrNotRunning, err)
	}
	return n.Groups(by, limit)
}

// Events returns the running node's wallet history events, or
// ErrNotRunning.
func (m *Manager) Events(from, to time.Time, limit int) ([]wallet.Event, error) {
	n, err := m.node()
	if n == nil {
		return nil, errors.Join(ErrNotRunning, err)
	}
	return n.Events(from, to, limit)
}

// Slice returns the running node's slice facts.
func (m *Manager) Slice() status.SliceInfo {
	n, err := m.node()
	if n == nil {
		p := "not started"
		if err != nil {
			p = err.Error()
		}
		return status.SliceInfo{Problem: p}
	}
	return n.Slice()
}

var _ status.Source = (*Manager)(nil)
