//go:build cgo && !kvasir_puresqlite

package dbfile

import _ "github.com/mattn/go-sqlite3" // SQLite driver "sqlite3" (cgo, the system's C SQLite compiled in)

// driverName is the database/sql driver of builds with cgo.
const driverName = "sqlite3"

// DriverDescription names the SQLite driver this build links.
const DriverDescription = "github.com/mattn/go-sqlite3 (cgo)"
