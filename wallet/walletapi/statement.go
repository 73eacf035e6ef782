package walletapi

import (
	"bytes"
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
)

// StatementVersion is the version of the statement body this package
// writes and accepts.
const StatementVersion = 1

// MaxStatementBody is the largest statement body accepted, in bytes.
const MaxStatementBody = 2048

// statementDomain prefixes the signed message so a statement signature can
// never be replayed as a signature of anything else (and vice versa).
const statementDomain = "kvasir-statement-v1\n"

// ErrBadStatement is returned for a statement whose signature, encoding or
// arithmetic does not check out.
var ErrBadStatement = errors.New("walletapi: bad statement")

// Statement is one credit the gateway made to one worker: the creditable
// bytes of ledger rows (LedgerAfter, LedgerUpTo] that belong to Worker,
// priced at RateNKVRPerByte. N numbers a worker's statements 1, 2, 3, ...
// without gaps, and the cumulative fields are the worker's totals after this
// credit, so a wallet can detect a missing or reordered statement.
type Statement struct {
	Version         int    `json:"v"`                  // StatementVersion
	Gateway         string `json:"gateway"`            // hex ed25519 public key of the signing gateway (64 chars)
	Worker          string `json:"worker"`             // hex ed25519 public key of the credited worker (64 chars)
	N               uint64 `json:"n"`                  // per-worker statement number, from 1
	LedgerAfter     int64  `json:"ledger_after"`       // ledger cursor before this credit (exclusive)
	LedgerUpTo      int64  `json:"ledger_upto"`        // ledger cursor after this credit (inclusive)
	Bytes           uint64 `json:"bytes"`              // creditable bytes credited now
	RejectedBytes   uint64 `json:"rejected_bytes"`     // bytes in the same rows metered as rejected (never paid)
	RateNKVRPerByte uint64 `json:"rate_nkvr_per_byte"` // price, nKVR per byte
	NKVR            uint64 `json:"nkvr"`               // Bytes * RateNKVRPerByte
	CumulativeBytes uint64 `json:"cumulative_bytes"`   // worker's credited bytes including this statement
	CumulativeNKVR  uint64 `json:"cumulative_nkvr"`    // worker's credited nKVR including this statement
	TimeUnixMilli   int64  `json:"time_ms"`            // when the gateway credited, unix milliseconds UTC
}

// Signed is a statement as sent on the wire and stored by both sides: the
// exact JSON body bytes that were signed, and the ed25519 signature over
// "kvasir-statement-v1\n" || Body. In JSON both fields are base64 (std).
type Signed struct {
	Body []byte `json:"body"`
	Sig  []byte `json:"sig"`
}

// Sign encodes st (setting st.Gateway from key and st.Version) and signs it.
// It returns ErrBadStatement if st is inconsistent (see Check).
func Sign(key ed25519.PrivateKey, st Statement) (Signed, error) {
	if len(key) != ed25519.PrivateKeySize {
		return Signed{}, fmt.Errorf("%w: signing key is %d bytes, want %d", ErrBadStatement, len(key), ed25519.PrivateKeySize)
	}
	st.Version = StatementVersion
	st.Gateway = hex.EncodeToString(key.Public().(ed25519.PublicKey))
	if err := st.Check(); err != nil {
		return Signed{}, err
	}
	body, err := json.Marshal(st)
	if err != nil {
		return Signed{}, fmt.Errorf("%w: %v", ErrBadStatement, err)
	}
	return Signed{Body: body, Sig: ed25519.Sign(key, append([]byte(statementDomain), body...))}, nil
}

// Open verifies s against the gateway public key pub and decodes it. It
// returns ErrBadStatement (wrapped) when the signature is wrong, the body is
// oversized or not a valid version-1 statement, the statement names another
// gateway, or its arithmetic is inconsistent.
func Open(pub ed25519.PublicKey, s Signed) (Statement, error) {
	if len(pub) != ed25519.PublicKeySize {
		return Statement{}, fmt.Errorf("%w: gateway key is %d bytes, want %d", ErrBadStatement, len(pub), ed25519.PublicKeySize)
	}
	if len(s.Body) > MaxStatementBody {
		return Statement{}, fmt.Errorf("%w: body of %d bytes exceeds %d", ErrBadStatement, len(s.Body), MaxStatementBody)
	}
	if len(s.Sig) != ed25519.SignatureSize || !ed25519.Verify(pub, append([]byte(statementDomain), s.Body...), s.Sig) {
		return Statement{}, fmt.Errorf("%w: signature does not verify", ErrBadStatement)
	}
	st, err := ParseStatement(s.Body)
	if err != nil {
		return Statement{}, err
	}
	if st.Gateway != hex.EncodeToString(pub) {
		return Statement{}, fmt.Errorf("%w: signed by %s but names gateway %s", ErrBadStatement, hex.EncodeToString(pub), st.Gateway)
	}
	return st, nil
}

// ParseStatement decodes a statement body without checking any signature
// and validates it with Check. Unknown fields are an error.
func ParseStatement(body []byte) (Statement, error) {
	if len(body) > MaxStatementBody {
		return Statement{}, fmt.Errorf("%w: body of %d bytes exceeds %d", ErrBadStatement, len(body), MaxStatementBody)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var st Statement
	if err := dec.Decode(&st); err != nil {
		return Statement{}, fmt.Errorf("%w: %v", ErrBadStatement, err)
	}
	if dec.More() {
		return Statement{}, fmt.Errorf("%w: trailing data after body", ErrBadStatement)
	}
	if err := st.Check(); err != nil {
		return Statement{}, err
	}
	return st, nil
}

// Check validates the statement's fields: version, 64-hex-char keys,
// N >= 1, 0 <= LedgerAfter < LedgerUpTo, NKVR == Bytes * RateNKVRPerByte,
// cumulative values >= the deltas and <= MaxAmount, TimeUnixMilli > 0.
func (st Statement) Check() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrBadStatement}, a...)...)
	}
	switch {
	case st.Version != StatementVersion:
		return bad("version %d, want %d", st.Version, StatementVersion)
	case !IsKeyHex(st.Gateway):
		return bad("gateway %q is not a 64-char lower-case hex key", st.Gateway)
	case !IsKeyHex(st.Worker):
		return bad("worker %q is not a 64-char lower-case hex key", st.Worker)
	case st.N < 1:
		return bad("statement number %d < 1", st.N)
	case st.LedgerAfter < 0 || st.LedgerUpTo <= st.LedgerAfter:
		return bad("ledger range (%d, %d] is empty or negative", st.LedgerAfter, st.LedgerUpTo)
	case st.CumulativeBytes < st.Bytes || st.CumulativeNKVR < st.NKVR:
		return bad("cumulative totals below this credit")
	case st.CumulativeBytes > MaxAmount || st.CumulativeNKVR > MaxAmount || st.RejectedBytes > MaxAmount:
		return bad("amount exceeds %d", uint64(MaxAmount))
	case st.TimeUnixMilli <= 0:
		return bad("time %d is not positive", st.TimeUnixMilli)
	}
	n, err := NKVR(st.Bytes, st.RateNKVRPerByte)
	if err != nil {
		return bad("%v", err)
	}
	if n != st.NKVR {
		return bad("nkvr %d != %d bytes x %d nKVR/byte", st.NKVR, st.Bytes, st.RateNKVRPerByte)
	}
	return nil
}

// IsKeyHex reports whether s is a lower-case hex encoding of an ed25519
// public key (exactly 64 characters of [0-9a-f]).
func IsKeyHex(s string) bool {
	if len(s) != 2*ed25519.PublicKeySize {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// StatementsPage is the JSON body of GET /v1/wallet/statements: the
// gateway's hex public key and up to MaxPage signed statements of the
// requesting worker with N > after, in increasing N. More is true when
// further statements exist beyond this page.
type StatementsPage struct {
	Gateway    string   `json:"gateway"`
	Statements []Signed `json:"statements"`
	More       bool     `json:"more"`
}

// MaxPage is the largest number of statements in one StatementsPage.
const MaxPage = 500

// KeyInfo is the JSON body of GET /v1/wallet/key: the gateway's statement
// signing key, hex ed25519 public key (64 chars).
type KeyInfo struct {
	Gateway string `json:"gateway"`
}

// Endpoint paths served by the gateway (backbone/credit.Handler).
const (
	PathStatements = "/v1/wallet/statements" // GET ?after=N, signed request
	PathKey        = "/v1/wallet/key"        // GET, public
)
