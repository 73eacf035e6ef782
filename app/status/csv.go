package status

import (
	"encoding/csv"
	"io"
	"strconv"

	"github.com/kvasir-ai/kvasir/wallet"
)

// CSVHeader is the header row WriteHistoryCSV writes.
var CSVHeader = []string{"time", "state", "session", "statement", "ledger", "bytes", "rejected_bytes", "nkvr", "kvr", "ref"}

// WriteHistoryCSV writes the wallet history as RFC 4180 CSV: CSVHeader,
// then one row per event in the given order. time is RFC 3339 UTC with
// milliseconds, bytes and nkvr are exact integers, kvr is the nKVR amount
// as a decimal with 9 places (exact, unlike the 5-decimal display), and
// statement is empty for events that are not credits.
func WriteHistoryCSV(w io.Writer, events []wallet.Event) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(CSVHeader); err != nil {
		return err
	}
	for _, e := range events {
		st := ""
		if e.State == wallet.StateCredited {
			st = strconv.FormatUint(e.Statement, 10)
		}
		rec := []string{
			e.Time.UTC().Format(timeLayout), e.State, e.Session, st, e.Ledger,
			strconv.FormatUint(e.Bytes, 10), strconv.FormatUint(e.Rejected, 10),
			strconv.FormatUint(e.NKVR, 10), ExactKVR(e.NKVR), e.Ref,
		}
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// ExactKVR renders nKVR as KVR with all 9 decimals: 8945664 ->
// "0.008945664".
func ExactKVR(nkvr uint64) string {
	const nano = 1_000_000_000
	frac := strconv.FormatUint(nkvr%nano+nano, 10)[1:]
	return strconv.FormatUint(nkvr/nano, 10) + "." + frac
}

// timeLayout is the CSV time format: RFC 3339 UTC with milliseconds.
const timeLayout = "2006-01-02T15:04:05.000Z07:00"
