// Package walletapi is the contract between the gateway's crediting service
// (backbone/credit) and the worker's wallet (wallet): accounting units and
// money formatting, the signed credit statement, and the signed-request
// scheme that guards GET /v1/wallet/statements. It has no dependencies
// beyond the standard library so both sides, and the mobile shells, can
// import it. See docs/accounting.md.
package walletapi

import (
	"errors"
	"fmt"
	"math/bits"
)

// Accounting units. Money is always an integer count of nano-KVR (nKVR);
// bytes are WebSocket message bytes bridged by the hub (docs/accounting.md).
const (
	// NanoPerKVR is the number of nKVR in one KVR (10^9).
	NanoPerKVR = 1_000_000_000
	// BytesPerUnit is the number of bridged bytes in one billing unit (10^6).
	BytesPerUnit = 1_000_000
	// DefaultRateNKVRPerByte is the default rate: 0.007 KVR per unit =
	// 7,000,000 nKVR per 10^6 bytes = 7 nKVR per byte.
	DefaultRateNKVRPerByte = 7
)

// ErrOverflow is returned when a money or byte computation does not fit in
// 63 bits (the range SQLite INTEGER columns can hold).
var ErrOverflow = errors.New("walletapi: value overflows int64")

// MaxAmount is the largest byte count or nKVR amount stored anywhere
// (SQLite INTEGER is a signed 64-bit value): 2^63-1.
const MaxAmount = 1<<63 - 1

// NKVR returns bytes * rate in nKVR, where rate is in nKVR per byte.
// It returns ErrOverflow when the product exceeds MaxAmount.
func NKVR(bytes, rateNKVRPerByte uint64) (uint64, error) {
	hi, lo := bits.Mul64(bytes, rateNKVRPerByte)
	if hi != 0 || lo > MaxAmount {
		return 0, fmt.Errorf("%w: %d bytes x %d nKVR/byte", ErrOverflow, bytes, rateNKVRPerByte)
	}
	return lo, nil
}

// AddAmount returns a+b, or ErrOverflow when the sum exceeds MaxAmount.
func AddAmount(a, b uint64) (uint64, error) {
	s, carry := bits.Add64(a, b, 0)
	if carry != 0 || s > MaxAmount {
		return 0, fmt.Errorf("%w: %d + %d", ErrOverflow, a, b)
	}
	return s, nil
}

// FormatKVR renders an nKVR amount as KVR with 5 decimals, rounded half up
// at the 5th decimal (10^4 nKVR), followed by " KVR".
// Example (the reference deployment's test vector): 8945664 -> "0.00895 KVR".
func FormatKVR(nkvr uint64) string {
	const step = NanoPerKVR / 100_000 // nKVR per displayed 0.00001 KVR
	q := nkvr / step
	if nkvr%step >= step/2 {
		q++
	}
	return fmt.Sprintf("%d.%05d KVR", q/100_000, q%100_000)
}

// FormatBytes renders a byte count for people in decimal (SI) units, the
// one unit system of kvasir's displays (the billing unit is 10^6 bytes,
// 1 MB): below 1000 bytes exactly ("512 B"), else with three significant
// figures or more: 1536 -> "1.54 kB", 1277952 -> "1.28 MB", 4e9 -> "4.00 GB".
func FormatBytes(b uint64) string {
	if b < 1000 {
		return fmt.Sprintf("%d B", b)
	}
	v, i := float64(b), 0
	for v >= 999.5 && i < 6 {
		v /= 1000
		i++
	}
	unit := []string{"B", "kB", "MB", "GB", "TB", "PB", "EB"}[i]
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f %s", v, unit)
	case v >= 10:
		return fmt.Sprintf("%.1f %s", v, unit)
	}
	return fmt.Sprintf("%.2f %s", v, unit)
}

// FormatUnits renders a byte count as billing units (10^6 bytes), exactly,
// with 6 decimals. Example: 1277952 -> "1.277952".
func FormatUnits(bytes uint64) string {
	return fmt.Sprintf("%d.%06d", bytes/BytesPerUnit, bytes%BytesPerUnit)
}
