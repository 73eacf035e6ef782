// Package dbfile identifies kvasir's SQLite files before anything writes to
// them. Each kind of file (the hub's contribution ledger, the gateway's
// wallets file, the worker's wallet) carries its own PRAGMA application_id
// (a 32-bit big-endian integer at byte offset 68 of the SQLite header, see
// https://www.sqlite.org/fileformat2.html#database_header) and its schema
// version in PRAGMA user_version (offset 60).
//
// Check inspects a file through a read-only connection (immutable=1 when no
// -wal or -journal file exists, so SQLite creates no -wal/-shm files), so a
// corrupt file, a file of another kind or one from a newer schema is
// refused with the file left byte for byte as it was. Only after Check has
// accepted a file may the caller open it read-write (which, for a WAL
// file, rewrites header bytes 18-19 and creates -wal/-shm).
//
// The package also picks the SQLite driver for every kvasir file: with cgo
// github.com/mattn/go-sqlite3 ("sqlite3"), without cgo (phones, Termux,
// static binaries; or with -tags kvasir_puresqlite) modernc.org/sqlite
// ("sqlite"), SQLite translated to Go. Both are SQLite 3 and write the
// same file format; the data source names made by DSN and ReadOnlyDSN
// (file: URIs with mattn's _journal_mode, _synchronous, _busy_timeout and
// _txlock keys, which modernc.org/sqlite reads the same way) work with
// both. Open with Open, never with sql.Open and a driver name.
package dbfile

import (
	"bytes"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Application ids (PRAGMA application_id) of kvasir's SQLite files: four
// ASCII letters read as a big-endian int32, so `xxd -s 68 -l 4 FILE` shows
// them.
const (
	AppIDLedger         int32 = 0x4B564C47 // "KVLG": hub contribution ledger (backbone/ledger)
	AppIDGatewayWallets int32 = 0x4B564757 // "KVGW": gateway wallets file (backbone/credit)
	AppIDWorkerWallet   int32 = 0x4B565757 // "KVWW": worker's local wallet (wallet)
)

// Errors returned by Check; each returned error wraps exactly one.
var (
	// ErrNotExist: the file does not exist (CheckExisting only).
	ErrNotExist = errors.New("dbfile: no such file")
	// ErrCorrupt: not an SQLite database, or fails PRAGMA quick_check.
	ErrCorrupt = errors.New("dbfile: file is corrupt or not an SQLite database")
	// ErrUnreadable: the file (or the -shm file SQLite needs beside a
	// write-ahead log) cannot be read or made by this user; the file may
	// be fine.
	ErrUnreadable = errors.New("dbfile: file cannot be read here")
	// ErrForeign: an SQLite database of another kind (another kvasir file,
	// or any other program's database).
	ErrForeign = errors.New("dbfile: file is of another kind")
	// ErrNewerSchema: a file of the right kind whose user_version is above
	// the version this program knows.
	ErrNewerSchema = errors.New("dbfile: file is from a newer schema")
)

// Kind describes one kind of kvasir SQLite file.
type Kind struct {
	Name    string   // for messages: "ledger", "gateway wallets file", "worker wallet"
	AppID   int32    // PRAGMA application_id written on creation
	Version int      // newest PRAGMA user_version this program knows (>= 1)
	Tables  []string // exact set of tables (sqlite_* excluded) of schema Version, sorted
	// Oldest is the oldest user_version this program still opens, with
	// the same Tables, and upgrades when it opens the file for writing
	// (0: Version only). Files of versions Oldest..Version-1 are Older.
	Oldest int
}

// oldest is the oldest user_version of k this program opens.
func (k Kind) oldest() int {
	if k.Oldest <= 0 || k.Oldest > k.Version {
		return k.Version
	}
	return k.Oldest
}

// The three kinds of kvasir file. Tables is the schema-1 table set, used to
// recognise files written before application ids existed (id 0).
var (
	Ledger         = Kind{Name: "kvasir contribution ledger", AppID: AppIDLedger, Version: 2, Oldest: 1, Tables: []string{"entries"}}
	GatewayWallets = Kind{Name: "kvasir gateway wallets file", AppID: AppIDGatewayWallets, Version: 1, Tables: []string{"cursor", "meta", "statements", "wallets"}}
	WorkerWallet   = Kind{Name: "kvasir worker wallet", AppID: AppIDWorkerWallet, Version: 1, Tables: []string{"meta", "payouts", "sessions", "statements"}}
)

var kinds = []Kind{Ledger, GatewayWallets, WorkerWallet}

// State is what Check found.
type State int

const (
	// Missing: no file at the path; the caller may create one.
	Missing State = iota
	// Empty: a 0-byte file or an SQLite database with no tables, user_version
	// 0 and application_id 0; the caller may initialise it.
	Empty
	// Legacy: application_id 0 but a user_version from Kind.Oldest to
	// Kind.Version and exactly Kind.Tables, i.e. written by kvasir before
	// application ids; the caller may adopt it by setting the id (and
	// upgrading it, read-write) or read it as is.
	Legacy
	// Current: application_id == Kind.AppID and user_version == Kind.Version.
	Current
	// Older: application_id == Kind.AppID, exactly Kind.Tables and a
	// user_version from Kind.Oldest to Kind.Version-1: written by an older
	// kvasir; the caller upgrades it (read-write) or reads it as is.
	Older
)

// Info is the result of Check.
type Info struct {
	State   State
	AppID   int32 // PRAGMA application_id (0 when Missing/Empty)
	Version int   // PRAGMA user_version
}

// Check inspects the file at path for kind k without modifying it (see the
// package comment). It returns Info with State Missing, Empty, Legacy, Older or
// Current, or an error wrapping ErrCorrupt, ErrUnreadable, ErrForeign or ErrNewerSchema
// that names the path and, for a foreign kvasir file, what it is.
func Check(path string, k Kind) (Info, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return Info{State: Missing}, nil
	}
	if err != nil {
		if errors.Is(err, fs.ErrPermission) {
			return Info{}, fmt.Errorf("%w: %v", ErrUnreadable, err)
		}
		return Info{}, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if st, err := f.Stat(); err == nil && st.IsDir() {
		f.Close()
		return Info{}, fmt.Errorf("%w: %s is a folder, not a %s file: give a file path (in that folder, for example)", ErrCorrupt, path, k.Name)
	}
	hdr := make([]byte, 100)
	n, rerr := io.ReadFull(f, hdr)
	f.Close()
	if n == 0 && rerr == io.EOF {
		return Info{State: Empty}, nil
	}
	if n < 100 || !bytes.HasPrefix(hdr, []byte("SQLite format 3\x00")) {
		return Info{}, fmt.Errorf("%w: %s is not an SQLite database (no SQLite header), not a %s", ErrCorrupt, path, k.Name)
	}
	dsn, err := ReadOnlyDSN(path)
	if err != nil {
		return Info{}, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	db, err := Open(dsn)
	if err != nil {
		return Info{}, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	defer db.Close()
	var info Info
	if err := db.QueryRow(`PRAGMA application_id`).Scan(&info.AppID); err != nil {
		// A write-ahead log in a folder this user may not write to: SQLite
		// cannot make the -shm file it needs to read the log.
		if _, werr := os.Stat(path + "-wal"); werr == nil && Writable(path) != nil {
			return Info{}, fmt.Errorf("%w: %s has a write-ahead log (%s-wal) and SQLite must create %s-shm beside it to read it, but the folder is not writable: read it as the user that writes it, or copy the file and its -wal to a writable folder (%v)",
				ErrUnreadable, path, path, path, err)
		}
		return Info{}, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	if err := db.QueryRow(`PRAGMA user_version`).Scan(&info.Version); err != nil {
		return Info{}, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	var qc string
	if err := db.QueryRow(`PRAGMA quick_check`).Scan(&qc); err != nil {
		return Info{}, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	if qc != "ok" {
		return Info{}, fmt.Errorf("%w: %s: quick_check: %s", ErrCorrupt, path, shortCheck(path, qc))
	}
	tables, err := tableNames(db)
	if err != nil {
		return Info{}, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	return classify(path, k, info, tables)
}

// shortCheck is quick_check's report qc on path for an error line: its
// first two lines and how many more there are (it lists every damaged
// page: a copy restored beside a stale -wal gives dozens).
func shortCheck(path, qc string) string {
	lines := strings.Split(strings.TrimSpace(qc), "\n")
	if len(lines) <= 2 {
		return strings.Join(lines, "; ")
	}
	return fmt.Sprintf("%s (and %d more lines: sqlite3 %s 'PRAGMA quick_check')", strings.Join(lines[:2], "; "), len(lines)-2, path)
}

// CheckExisting is Check for a reader that must not create the file: a
// missing or empty file is an error wrapping ErrNotExist or ErrForeign.
func CheckExisting(path string, k Kind) (Info, error) {
	info, err := Check(path, k)
	switch {
	case err != nil:
		return info, err
	case info.State == Missing:
		return info, fmt.Errorf("%w: %s (want a %s)", ErrNotExist, path, k.Name)
	case info.State == Empty:
		return info, fmt.Errorf("%w: %s is empty, not a %s", ErrForeign, path, k.Name)
	}
	return info, nil
}

func classify(path string, k Kind, info Info, tables []string) (Info, error) {
	if info.AppID == k.AppID {
		switch {
		case info.Version > k.Version:
			return info, fmt.Errorf("%w: %s is a %s of schema version %d; this program reads up to %d, upgrade kvasir",
				ErrNewerSchema, path, k.Name, info.Version, k.Version)
		case info.Version == k.Version && slices.Equal(tables, k.Tables):
			info.State = Current
			return info, nil
		case info.Version >= k.oldest() && info.Version < k.Version && slices.Equal(tables, k.Tables):
			info.State = Older
			return info, nil
		}
		return info, fmt.Errorf("%w: %s has the %s id but schema version %d and tables [%s]",
			ErrCorrupt, path, k.Name, info.Version, strings.Join(tables, " "))
	}
	if info.AppID != 0 {
		for _, o := range kinds {
			if o.AppID == info.AppID {
				return info, fmt.Errorf("%w: %s is a %s, not a %s", ErrForeign, path, o.Name, k.Name)
			}
		}
		return info, fmt.Errorf("%w: %s has application_id 0x%08x (another program's database), not a %s",
			ErrForeign, path, uint32(info.AppID), k.Name)
	}
	switch {
	case info.Version == 0 && len(tables) == 0:
		info.State = Empty
		return info, nil
	case slices.Equal(tables, k.Tables) && info.Version >= k.oldest() && info.Version <= k.Version:
		info.State = Legacy
		return info, nil
	case slices.Equal(tables, k.Tables) && info.Version > k.Version:
		return info, fmt.Errorf("%w: %s is a %s of schema version %d; this program reads up to %d, upgrade kvasir",
			ErrNewerSchema, path, k.Name, info.Version, k.Version)
	}
	for _, o := range kinds {
		if o.AppID != k.AppID && slices.Equal(tables, o.Tables) && info.Version >= o.oldest() && info.Version <= o.Version {
			return info, fmt.Errorf("%w: %s is a %s (written before application ids), not a %s", ErrForeign, path, o.Name, k.Name)
		}
	}
	return info, fmt.Errorf("%w: %s is an SQLite database with tables [%s] and user_version %d, not a %s",
		ErrForeign, path, strings.Join(tables, " "), info.Version, k.Name)
}

func tableNames(db *sql.DB) ([]string, error) {
	rows, err := db.Query(`SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite\_%' ESCAPE '\' ORDER BY name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// CreateEmpty creates path as an empty file with mode 0600 unless it
// exists (an empty file is a valid empty SQLite database), so that SQLite
// does not create it with the process umask. Errors are those of
// os.OpenFile other than os.ErrExist.
func CreateEmpty(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err == nil {
		return f.Close()
	}
	if errors.Is(err, os.ErrExist) {
		return nil
	}
	return err
}

// Driver is the database/sql driver name of this build's SQLite driver:
// "sqlite3" (mattn/go-sqlite3, cgo) or "sqlite" (modernc.org/sqlite, pure
// Go); DriverDescription says which in words.
const Driver = driverName

// Open opens the data source dsn (from DSN or ReadOnlyDSN) with this
// build's SQLite driver: sql.Open(Driver, dsn). Like sql.Open it does not
// touch the file until the first query.
func Open(dsn string) (*sql.DB, error) { return sql.Open(Driver, dsn) }

// DSN returns the SQLite data source name for the file at path with
// the given extra URI parameters (e.g. "_journal_mode=WAL").
func DSN(path string, params ...string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	u := url.URL{Scheme: "file", Path: filepath.ToSlash(abs), RawQuery: strings.Join(params, "&")}
	return u.String(), nil
}

// ReadOnlyDSN returns a read-only data source name for path that leaves
// the directory as it was: mode=ro&immutable=1 when neither path-wal nor
// path-journal exists (no writer has it open and nothing is to be
// recovered; SQLite then takes no locks and creates no -shm/-wal), else
// mode=ro, which reads a live writer's WAL consistently (SQLite may then
// create the -shm index next to the writer's -wal).
func ReadOnlyDSN(path string) (string, error) {
	_, werr := os.Stat(path + "-wal")
	_, jerr := os.Stat(path + "-journal")
	if errors.Is(werr, os.ErrNotExist) && errors.Is(jerr, os.ErrNotExist) {
		return DSN(path, "mode=ro", "immutable=1")
	}
	return DSN(path, "mode=ro", "_busy_timeout=10000")
}

// SetAppID is the statement that stamps k's application id, to run in the
// transaction that creates or adopts a file.
func (k Kind) SetAppID() string { return fmt.Sprintf(`PRAGMA application_id = %d`, k.AppID) }

// OpenReadOnly opens an existing file of kind k for reading only: it runs
// CheckExisting, then opens the file with ReadOnlyDSN, so it never writes to
// path nor leaves -wal/-shm files that were not there. A missing or empty
// file gives an error wrapping ErrNotExist or the check's error (ErrCorrupt,
// ErrForeign, ErrNewerSchema); checkErr reports whether err came from that
// check (the file is not a usable k) rather than from opening it.
func OpenReadOnly(path string, k Kind) (db *sql.DB, checkErr bool, err error) {
	if _, err := CheckExisting(path, k); err != nil {
		return nil, true, err
	}
	dsn, err := ReadOnlyDSN(path)
	if err != nil {
		return nil, false, err
	}
	db, err = Open(dsn)
	if err != nil {
		return nil, false, fmt.Errorf("open %s: %w", path, err)
	}
	return db, false, nil
}

// ErrNotWritable wraps Writable's error.
var ErrNotWritable = errors.New("dbfile: not writable")

// Writable reports, as an error wrapping ErrNotWritable that says what to
// fix, whether the database file at path and its folder can be written:
// SQLite in WAL mode creates its -wal and -shm files beside the database,
// and on a read-only folder it fails with "unable to open database file:
// no such file or directory", which names neither. nil when both can be
// written (or path does not exist yet: creating it reports its own error).
func Writable(path string) error {
	if f, err := os.OpenFile(path, os.O_RDWR, 0); err == nil {
		f.Close()
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %s: %v", ErrNotWritable, path, err)
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, ".kvasir-write-check-*")
	if err != nil {
		return fmt.Errorf("%w: the folder %s: %v (SQLite writes its -wal and -shm files beside the database)", ErrNotWritable, dir, err)
	}
	name := f.Name()
	f.Close()
	os.Remove(name)
	return nil
}
