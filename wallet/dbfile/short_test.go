package dbfile

import "testing"

// TestShortCheck: quick_check's page-by-page report is cut to its first
// two lines and a count in an error (it printed ~50 lines, twice, for a
// copy restored beside a stale -wal).
func TestShortCheck(t *testing.T) {
	qc := "*** in database main ***\nTree 8 page 34: btreeInitPage() returns error code 11\nPage 40: never used\nPage 41: never used\n"
	want := "*** in database main ***; Tree 8 page 34: btreeInitPage() returns error code 11 (and 2 more lines: sqlite3 w.db 'PRAGMA quick_check')"
	if got := shortCheck("w.db", qc); got != want {
		t.Fatalf("got %q\nwant %q", got, want)
	}
	if got := shortCheck("w.db", "row 3 missing from index x\n"); got != "row 3 missing from index x" {
		t.Fatalf("one line: %q", got)
	}
}
