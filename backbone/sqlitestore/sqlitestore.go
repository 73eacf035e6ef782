// Package sqlitestore holds what the SQLite stores of the money path share
// (the hub's contribution ledger, backbone/ledger, and the gateway's
// wallets file, backbone/credit), as backbone/pgstore does for their
// PostgreSQL stores: checking a file before anything writes to it
// (wallet/dbfile.Check: corrupt, foreign and newer files are refused and
// left byte for byte as they were), opening it with the settings exactly-
// once crediting relies on (WAL journal, synchronous=FULL, a 10 s busy
// timeout, BEGIN IMMEDIATE transactions) through this build's SQLite driver
// (dbfile.Open: cgo or pure Go), and bringing a new or empty file to the
// schema in one transaction; and opening a file read-only without writing
// to it.
//
// Durability: synchronous=FULL fsyncs the WAL on every commit. With NORMAL,
// a power cut may roll back the last commits; the ledger's AUTOINCREMENT
// would then hand out the lost ids again, and a gateway whose cursor
// already passed them would never credit the new rows.
package sqlitestore

import (
	"database/sql"
	"errors"
	"fmt"

	"github.com/kvasir-ai/kvasir/wallet/dbfile"
)

// File describes one kind of server SQLite file and how its package
// reports errors.
type File struct {
	// Kind is the file's dbfile kind: application id, the newest schema
	// version (PRAGMA user_version) this program knows, table set.
	Kind dbfile.Kind
	// Prefix starts the messages of errors that are not refusals
	// ("ledger", "credit").
	Prefix string
	// ErrSchema is the package's sentinel wrapped by every refusal (with
	// the dbfile error: dbfile.ErrCorrupt, ErrForeign, ErrNewerSchema).
	ErrSchema error
	// Schema creates the tables of Kind.Version (CREATE ... IF NOT EXISTS:
	// it may run on a file that has them).
	Schema string
	// Upgrades[i] brings a file of user_version max(Kind.Oldest, 1)+i to
	// the next version, in the transaction of the open: an Older or Legacy
	// file opened read-write gets the ones it lacks, then Schema, then its
	// new version. An upgrade that fails leaves the file as it was.
	Upgrades []func(tx *sql.Tx) error
	// Create creates the file (mode 0600, dbfile.CreateEmpty) before it
	// is opened, instead of leaving that to the driver.
	Create bool
	// Reapply runs Schema on every read-write open; otherwise only on a
	// file that is not yet current (new, empty, or written before
	// application ids).
	Reapply bool
	// Verify, when set, is a query run after the schema, in the same
	// transaction, that fails on tables of another shape (a refusal).
	Verify string
}

// Open opens (creating if needed) the file at path read-write. The file is
// first checked through a read-only connection (dbfile.Check); a refusal
// wraps f.ErrSchema and the dbfile error. A new or empty file gets
// f.Schema, user_version = Kind.Version and the kind's application id; a
// file written before application ids (id 0, a version from Kind.Oldest
// to Kind.Version, exactly the kind's tables) is adopted by setting the id. A user_version above Kind.Version
// found once the write lock is held (another process upgraded the file
// since the check) is refused too. A file of an older version it knows
// (Kind.Oldest and up) is upgraded (f.Upgrades) in that transaction.
func (f File) Open(path string) (*sql.DB, error) {
	db, _, err := f.OpenFrom(path)
	return db, err
}

// OpenFrom is Open, also returning the schema version the file had when
// this open took the write lock: 0 for a new or empty file, below
// Kind.Version for a file this open upgraded (another process that opened
// it at the same time and upgraded it first makes it Kind.Version).
func (f File) OpenFrom(path string) (*sql.DB, int, error) {
	info, err := dbfile.Check(path, f.Kind)
	if errors.Is(err, dbfile.ErrUnreadable) {
		return nil, 0, fmt.Errorf("%s: %w", f.Prefix, err) // the file may be fine
	} else if err != nil {
		return nil, 0, fmt.Errorf("%w: %w", f.ErrSchema, err)
	}
	if f.Create {
		if err := dbfile.CreateEmpty(path); err != nil {
			return nil, 0, fmt.Errorf("%s: create %s: %w", f.Prefix, path, err)
		}
	}
	dsn, err := dbfile.DSN(path, "_journal_mode=WAL", "_synchronous=FULL", "_busy_timeout=10000", "_txlock=immediate")
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w", f.Prefix, err)
	}
	db, err := dbfile.Open(dsn) // this build's SQLite driver (cgo or pure Go)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: open %s: %w", f.Prefix, path, writableOr(path, err))
	}
	from, err := f.init(db, info.State)
	if err != nil {
		db.Close()
		return nil, 0, fmt.Errorf("%s: open %s: %w", f.Prefix, path, writableOr(path, err))
	}
	return db, from, nil
}

// init applies the schema in one BEGIN IMMEDIATE transaction and returns
// the user_version it found.
func (f File) init(db *sql.DB, state dbfile.State) (int, error) {
	tx, err := db.Begin()
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	var v int
	if err := tx.QueryRow(`PRAGMA user_version`).Scan(&v); err != nil {
		return 0, err
	}
	// Another process may have created or upgraded the file since the check.
	if v > f.Kind.Version {
		return 0, fmt.Errorf("%w: file has schema version %d, this program knows %d", f.ErrSchema, v, f.Kind.Version)
	}
	if v > 0 && v < f.Kind.Version {
		for from := v; from < f.Kind.Version; from++ {
			i := from - max(f.Kind.Oldest, 1)
			if i < 0 || i >= len(f.Upgrades) {
				return 0, fmt.Errorf("%w: no upgrade of schema version %d to %d", f.ErrSchema, from, from+1)
			}
			if err := f.Upgrades[i](tx); err != nil {
				return 0, fmt.Errorf("%w: upgrade of schema version %d to %d: %v", f.ErrSchema, from, from+1, err)
			}
		}
	}
	if f.Reapply || state != dbfile.Current || v < f.Kind.Version {
		if _, err := tx.Exec(f.Schema); err != nil {
			return 0, fmt.Errorf("%w: %v", f.ErrSchema, err)
		}
		if _, err := tx.Exec(fmt.Sprintf(`PRAGMA user_version = %d`, f.Kind.Version)); err != nil {
			return 0, err
		}
		if _, err := tx.Exec(f.Kind.SetAppID()); err != nil {
			return 0, err
		}
	}
	if f.Verify != "" {
		if _, err := tx.Exec(f.Verify); err != nil {
			return 0, fmt.Errorf("%w: %v", f.ErrSchema, err)
		}
	}
	return v, tx.Commit()
}

// OpenReadOnly opens an existing file for reading only; it never writes to
// path nor leaves -wal/-shm files that were not there (dbfile.OpenReadOnly,
// dbfile.ReadOnlyDSN). A missing file gives an error wrapping
// dbfile.ErrNotExist; an empty, corrupt, foreign or newer file one
// wrapping f.ErrSchema and the dbfile error.
func (f File) OpenReadOnly(path string) (*sql.DB, error) {
	db, checkErr, err := dbfile.OpenReadOnly(path, f.Kind)
	if err != nil {
		if checkErr && !errors.Is(err, dbfile.ErrNotExist) && !errors.Is(err, dbfile.ErrUnreadable) {
			return nil, fmt.Errorf("%w: %w", f.ErrSchema, err)
		}
		return nil, fmt.Errorf("%s: %w", f.Prefix, err)
	}
	return db, nil
}

// writableOr returns why path cannot be written when it cannot (a
// read-only file system or folder: SQLite then says only "unable to open
// database file: no such file or directory"), else err.
func writableOr(path string, err error) error {
	if werr := dbfile.Writable(path); werr != nil {
		return fmt.Errorf("%w (%v)", werr, err)
	}
	return err
}
