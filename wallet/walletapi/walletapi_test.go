package walletapi

import (
	"crypto/ed25519"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestUnitsReferenceVector(t *testing.T) {
	// 1,277,952 bytes -> 1.277952 units -> 8,945,664 nKVR -> "0.00895 KVR".
	n, err := NKVR(1_277_952, DefaultRateNKVRPerByte)
	if err != nil || n != 8_945_664 {
		t.Fatalf("NKVR = %d, %v", n, err)
	}
	if got := FormatUnits(1_277_952); got != "1.277952" {
		t.Errorf("FormatUnits = %q", got)
	}
	if got := FormatKVR(n); got != "0.00895 KVR" {
		t.Errorf("FormatKVR = %q", got)
	}
	// 0.007 KVR per unit, as the issue states it: 7e6 nKVR per 1e6 bytes.
	if n, _ := NKVR(BytesPerUnit, DefaultRateNKVRPerByte); n != 7*NanoPerKVR/1000 {
		t.Errorf("one unit = %d nKVR", n)
	}
}

func TestFormatKVRRounding(t *testing.T) {
	for _, c := range []struct {
		n    uint64
		want string
	}{
		{0, "0.00000 KVR"}, {4999, "0.00000 KVR"}, {5000, "0.00001 KVR"}, {10000, "0.00001 KVR"},
		{1_000_000_000, "1.00000 KVR"}, {1_234_565_000, "1.23457 KVR"}, {999_995_000, "1.00000 KVR"},
		{MaxAmount, "9223372036.85478 KVR"},
	} {
		if got := FormatKVR(c.n); got != c.want {
			t.Errorf("FormatKVR(%d) = %q, want %q", c.n, got, c.want)
		}
	}
	if _, err := NKVR(1<<62, 2); !errors.Is(err, ErrOverflow) {
		t.Errorf("NKVR overflow: %v", err)
	}
	if _, err := NKVR(1<<40, 1<<40); !errors.Is(err, ErrOverflow) {
		t.Errorf("NKVR 128-bit overflow: %v", err)
	}
	if _, err := AddAmount(MaxAmount, 1); !errors.Is(err, ErrOverflow) {
		t.Errorf("AddAmount overflow: %v", err)
	}
}

func key(b byte) ed25519.PrivateKey {
	s := make([]byte, 32)
	s[0] = b
	return ed25519.NewKeyFromSeed(s)
}

func validStatement(worker ed25519.PrivateKey) Statement {
	return Statement{Worker: hex.EncodeToString(worker.Public().(ed25519.PublicKey)), N: 3, LedgerAfter: 10, LedgerUpTo: 12,
		Bytes: 100, RateNKVRPerByte: 7, NKVR: 700, CumulativeBytes: 1000, CumulativeNKVR: 7000, TimeUnixMilli: 1}
}

func TestStatementSignOpen(t *testing.T) {
	gw := key(1)
	sg, err := Sign(gw, validStatement(key(2)))
	if err != nil {
		t.Fatal(err)
	}
	st, err := Open(gw.Public().(ed25519.PublicKey), sg)
	if err != nil || st.NKVR != 700 || st.Gateway != hex.EncodeToString(gw.Public().(ed25519.PublicKey)) {
		t.Fatalf("Open = %+v, %v", st, err)
	}
	// Another gateway's key does not verify it.
	if _, err := Open(key(3).Public().(ed25519.PublicKey), sg); !errors.Is(err, ErrBadStatement) {
		t.Errorf("wrong key: %v", err)
	}
	// A changed amount breaks the signature.
	forged := Signed{Body: []byte(strings.Replace(string(sg.Body), `"nkvr":700`, `"nkvr":7000`, 1)), Sig: sg.Sig}
	if string(forged.Body) == string(sg.Body) {
		t.Fatal("test did not change the body")
	}
	if _, err := Open(gw.Public().(ed25519.PublicKey), forged); !errors.Is(err, ErrBadStatement) {
		t.Errorf("forged body: %v", err)
	}
	// Inconsistent arithmetic is refused at signing.
	bad := validStatement(key(2))
	bad.NKVR = 701
	if _, err := Sign(gw, bad); !errors.Is(err, ErrBadStatement) {
		t.Errorf("bad arithmetic signed: %v", err)
	}
}

func TestRequestSignVerify(t *testing.T) {
	k := key(5)
	now := time.UnixMilli(1_700_000_000_000)
	h, err := SignRequest(k, "GET", "/v1/wallet/statements?after=3", now)
	if err != nil {
		t.Fatal(err)
	}
	pub, nonce, err := VerifyRequest(h, "GET", "/v1/wallet/statements?after=3", now.Add(time.Second), DefaultMaxSkew)
	if err != nil || !pub.Equal(k.Public()) || len(nonce) != 32 {
		t.Fatalf("verify: %v", err)
	}
	for name, c := range map[string]struct {
		method, target string
		at             time.Time
	}{
		"method": {"POST", "/v1/wallet/statements?after=3", now},
		"query":  {"GET", "/v1/wallet/statements?after=0", now},
		"stale":  {"GET", "/v1/wallet/statements?after=3", now.Add(DefaultMaxSkew + time.Second)},
		"future": {"GET", "/v1/wallet/statements?after=3", now.Add(-DefaultMaxSkew - time.Second)},
	} {
		if _, _, err := VerifyRequest(h, c.method, c.target, c.at, DefaultMaxSkew); !errors.Is(err, ErrUnauthorized) {
			t.Errorf("%s: %v, want ErrUnauthorized", name, err)
		}
	}
	c := NewNonceCache(time.Minute, 2)
	if !c.Use("a", now) || c.Use("a", now.Add(time.Second)) {
		t.Fatal("replay not refused")
	}
	if !c.Use("b", now) || c.Use("c", now) {
		t.Fatal("full cache must refuse")
	}
	if !c.Use("c", now.Add(2*time.Minute)) || !c.Use("a", now.Add(2*time.Minute)) {
		t.Fatal("expired nonces must be forgotten")
	}
	// One signer cannot fill the cache for everyone: it is refused with
	// ErrTooMany past DefaultPerSigner nonces, the others go on; a full
	// cache says so (ErrBusy), not "nonce already used".
	c = NewNonceCache(time.Minute, DefaultPerSigner+2)
	for i := range DefaultPerSigner {
		if err := c.Check("flooder", fmt.Sprint(i), now); err != nil {
			t.Fatalf("nonce %d: %v", i, err)
		}
	}
	if err := c.Check("flooder", "x", now); !errors.Is(err, ErrTooMany) {
		t.Fatalf("past the per-signer bound: %v", err)
	}
	if err := c.Check("flooder", "0", now); !errors.Is(err, ErrReplay) {
		t.Fatalf("replay: %v", err)
	}
	if c.Check("honest", "1", now) != nil || c.Check("honest", "2", now) != nil {
		t.Fatal("another signer refused")
	}
	if err := c.Check("third", "1", now); !errors.Is(err, ErrBusy) {
		t.Fatalf("full cache: %v", err)
	}
	if err := c.Check("flooder", "y", now.Add(2*time.Minute)); err != nil {
		t.Fatalf("after the TTL: %v", err)
	}
}

func FuzzParseStatement(f *testing.F) {
	gw := key(1)
	sg, _ := Sign(gw, validStatement(key(2)))
	f.Add(sg.Body)
	f.Add(sg.Body[:len(sg.Body)/2])
	f.Add([]byte(`{"v":1,"nkvr":18446744073709551615,"bytes":18446744073709551615,"rate_nkvr_per_byte":2}`))
	f.Add([]byte(strings.Repeat(" ", MaxStatementBody+1)))
	f.Fuzz(func(t *testing.T, body []byte) {
		st, err := ParseStatement(body)
		if err != nil {
			return
		}
		if n, err := NKVR(st.Bytes, st.RateNKVRPerByte); err != nil || n != st.NKVR || st.N == 0 {
			t.Fatalf("accepted inconsistent statement %+v", st)
		}
	})
}

func FuzzVerifyRequest(f *testing.F) {
	k := key(5)
	now := time.UnixMilli(1_700_000_000_000)
	h, _ := SignRequest(k, "GET", "/x?a=1", now)
	f.Add(h.Get(HeaderKey), h.Get(HeaderTime), h.Get(HeaderNonce), h.Get(HeaderSig), "/x?a=1")
	f.Add("", "", "", "", "")
	f.Add(strings.Repeat("a", 64), "99999999999999999999", strings.Repeat("0", 32), strings.Repeat("f", 128), "/")
	f.Fuzz(func(t *testing.T, kh, ts, nonce, sig, target string) {
		hh := http.Header{}
		hh.Set(HeaderKey, kh)
		hh.Set(HeaderTime, ts)
		hh.Set(HeaderNonce, nonce)
		hh.Set(HeaderSig, sig)
		pub, _, err := VerifyRequest(hh, "GET", target, now, DefaultMaxSkew)
		if err == nil && (!pub.Equal(k.Public()) || target != "/x?a=1") {
			t.Fatalf("accepted a request not signed by the key: %q %q", kh, target)
		}
	})
}
