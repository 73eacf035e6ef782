//go:build !cgo || kvasir_puresqlite

package dbfile

import _ "modernc.org/sqlite" // SQLite driver "sqlite" (SQLite translated to Go, no cgo)

// driverName is the database/sql driver of builds without cgo (phones,
// Termux, static binaries) or with -tags kvasir_puresqlite.
const driverName = "sqlite"

// DriverDescription names the SQLite driver this build links.
const DriverDescription = "modernc.org/sqlite (pure Go)"
