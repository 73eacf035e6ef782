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
	total := 0
	for {
		after, err := w.LastStatement()
		if err != nil {
			return total, err
		}
		target := walletapi.PathStatements + "?after=" + strconv.FormatUint(after, 10)
		h, err := walletapi.SignRequest(key, http.MethodGet, target, time.Now())
		if err != nil {
			return total, err
		}
		var page walletapi.StatementsPage
		if err := getJSON(ctx, hc, base+target, h, &page); err != nil {
			return total, err
		}
		if page.Gateway != hex.EncodeToString(gw) {
			return total, fmt.Errorf("%w: gateway serves key %s, pinned %s", ErrGatewayKey, page.Gateway, hex.EncodeToString(gw))
		}
		if len(page.Statements) > walletapi.MaxPage {
			return total, fmt.Errorf("%w: %d statements in one page", ErrSync, len(page.Statements))
		}
		n, err := w.AddStatements(gw, page.Statements)
		total += n
		if err != nil {
			return total, err
		}
		if !page.More || len(page.Statements) == 0 {
			return total, nil
		}
	}
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
