package wallet

import (
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvasir-ai/kvasir/wallet/walletapi"
)

// MaxPageBytes bounds a statements page body read by Sync, in bytes.
const MaxPageBytes = 4 << 20

// ErrSync: the gateway answered with an error status or a malformed body.
var ErrSync = errors.New("wallet: statement sync failed")

// Sync fetches this worker's new statements from the gateway at baseURL
// (e.g. "https://gw.example:443"), signing each request with key, and
// stores them with AddStatements (verified against the pinned gateway key;
// on first use the key served at /v1/wallet/key is pinned). hc nil means a
// client with a 30 s timeout. It returns the number of statements added.
func (w *Wallet) Sync(ctx context.Context, hc *http.Client, baseURL string, key ed25519.PrivateKey) (int, error) {
	if hc == nil {
		hc = &http.Client{Timeout: 30 * time.Second}
	}
	if hex.EncodeToString(key.Public().(ed25519.PublicKey)) != w.worker {
		return 0, fmt.Errorf("%w: signing key is not this wallet's identity", ErrWrongIdentity)
	}
	base := strings.TrimRight(baseURL, "/")
	gw, err := w.PinnedGateway()
	if err != nil {
		return 0, err
	}
	if gw == nil {
		var ki walletapi.KeyInfo
		if err := getJSON(ctx, hc, base+walletapi.PathKey, nil, &ki); err != nil {
			return 0, err
		}
		if !walletapi.IsKeyHex(ki.Gateway) {
			return 0, fmt.Errorf("%w: gateway key %q", ErrSync, ki.Gateway)
		}
		gw, _ = hex.DecodeString(ki.Gateway)
	}
	page := func(after uint64) (walletapi.StatementsPage, error) {
		var p walletapi.StatementsPage
		target := walletapi.PathStatements + "?after=" + strconv.FormatUint(after, 10)
		h, err := walletapi.SignRequest(key, http.MethodGet, target, time.Now())
		if err != nil {
			return p, err
		}
		if err := getJSON(ctx, hc, base+target, h, &p); err != nil {
			return p, err
		}
		if p.Gateway != hex.EncodeToString(gw) {
			return p, fmt.Errorf("%w: gateway serves key %s, pinned %s", ErrGatewayKey, p.Gateway, hex.EncodeToString(gw))
		}
		if len(p.Statements) > walletapi.MaxPage {
			return p, fmt.Errorf("%w: %d statements in one page", ErrSync, len(p.Statements))
		}
		return p, nil
	}
	total := 0
	for first := true; ; first = false {
		last, err := w.LastStatement()
		if err != nil {
			return total, err
		}
		// The first page starts at the wallet's own last statement, which
		// the gateway must still hold as it is: one it no longer holds, or
		// holds otherwise, means it reissued its statements from an older
		// backup of its wallets (ErrReissued).
		after := last
		if first && last > 0 {
			after = last - 1
		}
		p, err := page(after)
		if err != nil {
			return total, err
		}
		n, err := w.AddStatements(gw, p.Statements)
		if err == nil && first && last > 0 && len(p.Statements) == 0 {
			err = fmt.Errorf("%w: %w: the gateway no longer holds statement %d", ErrStatement, ErrReissued, last)
		}
		total += n
		if errors.Is(err, ErrReissued) {
			return total, w.resync(gw, page)
		}
		if err != nil {
			return total, err
		}
		if !p.More || len(p.Statements) == 0 {
			return total, nil
		}
	}
}

// resync takes the gateway's whole chain (every page from the first) and
// makes it the wallet's (ReplaceStatements, which records the fork for
// Summary to report).
func (w *Wallet) resync(gw ed25519.PublicKey, page func(after uint64) (walletapi.StatementsPage, error)) error {
	var chain []walletapi.Signed
	for after := uint64(0); ; {
		p, err := page(after)
		if err != nil {
			return err
		}
		chain = append(chain, p.Statements...)
		if !p.More || len(p.Statements) == 0 {
			break
		}
		after += uint64(len(p.Statements))
	}
	_, _, err := w.ReplaceStatements(gw, chain)
	return err // the fork is recorded: Summary's Reissued says so
}

func getJSON(ctx context.Context, hc *http.Client, u string, h http.Header, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrSync, err)
	}
	for k, vs := range h {
		req.Header[k] = vs
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrSync, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxPageBytes+1))
	if err != nil {
		return fmt.Errorf("%w: %v", ErrSync, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%w: GET %s: %s: %s", ErrSync, req.URL.Path, resp.Status, strings.TrimSpace(string(body[:min(len(body), 256)])))
	}
	if len(body) > MaxPageBytes {
		return fmt.Errorf("%w: body exceeds %d bytes", ErrSync, MaxPageBytes)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("%w: %v", ErrSync, err)
	}
	return nil
}
