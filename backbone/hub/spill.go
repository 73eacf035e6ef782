package hub

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/ledger"
)

// appendSpill adds rows to the spill file at path (created 0600), one JSON
// object per line, and syncs it.
func appendSpill(path string, rows []ledger.Entry) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for _, e := range rows {
		if err := enc.Encode(e); err != nil {
			f.Close()
			return err
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// readSpill returns the rows of the spill file at path (none when there is
// no file); a line that is not a valid row is an error naming the line.
func readSpill(path string) ([]ledger.Entry, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var rows []ledger.Entry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var e ledger.Entry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("%s line %d: %w", path, line, err)
		}
		if err := ledger.Validate(e); err != nil {
			return nil, fmt.Errorf("%s line %d: %w", path, line, err)
		}
		rows = append(rows, e)
	}
	return rows, sc.Err()
}

// unspill appends the rows of an existing SpillFile (rows a previous
// Close could not append) to the ledger before anything is metered, then
// removes the file. A ledger that refuses them, or a file that does not
// read, fails Start and leaves the file as it is.
//
// The file is first renamed to SpillFile + ".appending", so that a file
// this process could not remove once appended (a folder it may not write
// to) fails Start before anything is appended, instead of being appended
// at every start, where only the ledger's check of each row's (SessionID,
// Seq) would keep it from being credited again. A ".appending" file found
// at Start is one a previous start was appending when it stopped: Start
// fails, names it and its sessions, and says to rename it back (both
// ledgers keep Seq, so rows already recorded are not recorded twice).
func (h *Hub) unspill() error {
	if h.cfg.SpillFile == "" || h.cfg.Meter == nil {
		return nil
	}
	claimed := h.cfg.SpillFile + ".appending"
	if _, err := os.Stat(claimed); err == nil {
		var sessions []string
		unnumbered := false
		if rows, rerr := readSpill(claimed); rerr == nil {
			for _, e := range rows {
				if !slices.Contains(sessions, e.SessionID) {
					sessions = append(sessions, e.SessionID)
				}
				unnumbered = unnumbered || e.Seq == 0
			}
		}
		advice := fmt.Sprintf("Rename it to %s and start again: a row already in the ledger is not recorded twice", h.cfg.SpillFile)
		if unnumbered {
			// Written by a hub from before rows were numbered: the ledger
			// cannot tell its rows from new ones.
			advice = fmt.Sprintf("Some carry no number, so the ledger would record them again. Look for those sessions in the ledger first: remove the file if they are there, rename it to %s if not", h.cfg.SpillFile)
		}
		return fmt.Errorf("hub: %s is left from a start that stopped while appending it to the ledger: its rows (sessions %s) may be in the ledger already. %s (docs/operating.md, Upgrading)", claimed, strings.Join(sessions, ", "), advice)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("hub: spill file: %w", err)
	}
	rows, err := readSpill(h.cfg.SpillFile)
	if err != nil {
		return fmt.Errorf("hub: spill file: %w", err)
	}
	if len(rows) == 0 {
		return nil
	}
	if err := os.Rename(h.cfg.SpillFile, claimed); err != nil {
		return fmt.Errorf("hub: the spill file %s cannot be moved aside, so it could not be removed once appended and would be appended again: %w; nothing was appended", h.cfg.SpillFile, err)
	}
	for i := range rows {
		rows[i].ID = 0 // the ledger assigns ids
	}
	if bm, ok := h.cfg.Meter.(BatchMeter); ok {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = bm.AppendAll(ctx, rows)
		cancel()
		if err != nil {
			// All or none: none was appended.
			if rerr := os.Rename(claimed, h.cfg.SpillFile); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
	} else {
		for i, e := range rows {
			if err = h.cfg.Meter.Append(e); err != nil {
				// Keep only the rows not appended, so none is appended twice.
				werr := rewriteSpill(h.cfg.SpillFile, rows[i:])
				if werr == nil {
					werr = os.Remove(claimed)
				}
				err = errors.Join(err, werr)
				break
			}
		}
	}
	if err != nil {
		return fmt.Errorf("hub: appending the %d ledger rows of the spill file %s (a previous hub could not append them): %w; nothing is lost while the file is kept", len(rows), h.cfg.SpillFile, err)
	}
	if err := os.Remove(claimed); err != nil {
		return fmt.Errorf("hub: spill file appended, but %s not removed: remove it before the next start: %w", claimed, err)
	}
	h.log.Info("hub: appended the spill file's rows, those not already in the ledger (a row is recorded once)", "file", h.cfg.SpillFile, "rows", len(rows))
	return nil
}

// checkSpillWritable makes sure a stop could write the spill file: a file
// created and removed beside it. A folder that is missing or may not be
// written fails Start, rather than the rows of a stop whose ledger refuses
// them being lost then (the file is needed only at that moment).
func (h *Hub) checkSpillWritable() error {
	if h.cfg.SpillFile == "" || h.cfg.Meter == nil {
		return nil
	}
	f, err := os.CreateTemp(filepath.Dir(h.cfg.SpillFile), ".kvasir-spill-check-*")
	if err != nil {
		return fmt.Errorf("hub: the spill file %s could not be written when a stop needs it (rows the ledger refuses then would be lost): %w", h.cfg.SpillFile, err)
	}
	f.Close()
	return os.Remove(f.Name())
}

// rewriteSpill replaces the spill file at path with rows (written to a
// temporary file, synced and renamed over it).
func rewriteSpill(path string, rows []ledger.Entry) error {
	tmp := path + ".tmp"
	_ = os.Remove(tmp)
	if err := appendSpill(tmp, rows); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
