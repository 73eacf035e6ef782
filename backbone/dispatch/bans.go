package dispatch

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"
)

// Ban is one worker key the dispatcher refuses until a time.
type Ban struct {
	Worker string    `json:"worker"` // hex ed25519 public key
	Since  time.Time `json:"since"`  // when it was banned
	Until  time.Time `json:"until"`  // refused before this instant
	Reason string    `json:"reason"` // what the worker did
}

// Bans is the set of banned worker keys, kept in a JSON file (when it has
// a path) so that a ban survives a backbone restart. It is safe for
// concurrent use.
//
// File format: {"v":1,"bans":[Ban...]}, written whole to a temporary file
// in the same directory, fsynced, renamed over the old one and the
// directory fsynced, so a crash leaves the old or the new list, never a
// mix. Expired bans are dropped when the file is next written.
type Bans struct {
	path string
	mu   sync.Mutex
	m    map[string]Ban
}

type bansFile struct {
	V    int   `json:"v"`
	Bans []Ban `json:"bans"`
}

// ErrBansFile wraps the errors of a ban file that exists but cannot be
// read as one.
var ErrBansFile = errors.New("dispatch: bad ban file")

// OpenBans reads the ban list at path ("" keeps bans in memory only). A
// missing file is an empty list (created on the first ban); a file that is
// not a version 1 ban list fails with ErrBansFile (wrapped), an unreadable
// one with the I/O error.
func OpenBans(path string) (*Bans, error) {
	b := &Bans{path: path, m: map[string]Ban{}}
	if path == "" {
		return b, nil
	}
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return b, nil
	}
	if err != nil {
		return nil, fmt.Errorf("dispatch: ban file: %w", err)
	}
	var f bansFile
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, fmt.Errorf("%w %s: %v", ErrBansFile, path, err)
	}
	if f.V != 1 {
		return nil, fmt.Errorf("%w %s: version %d, want 1", ErrBansFile, path, f.V)
	}
	for _, x := range f.Bans {
		if x.Worker == "" || x.Until.IsZero() {
			return nil, fmt.Errorf("%w %s: entry without worker or until", ErrBansFile, path)
		}
		if old, ok := b.m[x.Worker]; !ok || x.Until.After(old.Until) {
			b.m[x.Worker] = x
		}
	}
	return b, nil
}

// DefaultBanFile is the ban file of the backbone commands:
// $XDG_CONFIG_HOME/kvasir/bans.json (os.UserConfigDir), or "kvasir-bans.json"
// in the working directory when there is no config directory.
func DefaultBanFile() string {
	dir, err := os.UserConfigDir()
	if err != nil {
		return "kvasir-bans.json"
	}
	return filepath.Join(dir, "kvasir", "bans.json")
}

// Banned returns worker's ban and true when it is banned at now.
func (b *Bans) Banned(worker string, now time.Time) (Ban, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	x, ok := b.m[worker]
	if !ok || !now.Before(x.Until) {
		return Ban{}, false
	}
	return x, true
}

// Add bans worker until until (an earlier existing ban is extended, a
// later one kept) and writes the file. The ban holds in memory even when
// the write fails; the error says why it will not survive a restart.
func (b *Bans) Add(worker string, since, until time.Time, reason string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if old, ok := b.m[worker]; !ok || until.After(old.Until) {
		b.m[worker] = Ban{Worker: worker, Since: since, Until: until, Reason: reason}
	}
	return b.writeLocked(since)
}

// List returns the bans in force at now, soonest to expire first.
func (b *Bans) List(now time.Time) []Ban {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []Ban
	for _, x := range b.m {
		if now.Before(x.Until) {
			out = append(out, x)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Until.Before(out[j].Until) })
	return out
}

// writeLocked writes the bans in force at now to the file; b.mu is held.
func (b *Bans) writeLocked(now time.Time) error {
	if b.path == "" {
		return nil
	}
	f := bansFile{V: 1, Bans: []Ban{}}
	for w, x := range b.m {
		if !now.Before(x.Until) {
			delete(b.m, w)
			continue
		}
		f.Bans = append(f.Bans, x)
	}
	sort.Slice(f.Bans, func(i, j int) bool { return f.Bans[i].Worker < f.Bans[j].Worker })
	raw, err := json.MarshalIndent(f, "", " ")
	if err != nil {
		return err
	}
	dir := filepath.Dir(b.path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("dispatch: ban file: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".bans-*")
	if err != nil {
		return fmt.Errorf("dispatch: ban file: %w", err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename: no such file
	if _, err = tmp.Write(append(raw, '\n')); err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), b.path)
	}
	if err != nil {
		return fmt.Errorf("dispatch: ban file: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
