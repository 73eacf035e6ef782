package credit

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/kvasir-ai/kvasir/wallet/walletapi"
)

// HandlerOptions tunes Handler; the zero value is the production setting.
type HandlerOptions struct {
	MaxSkew time.Duration    // freshness window; 0 means walletapi.DefaultMaxSkew
	Now     func() time.Time // clock; nil means time.Now
}

// Handler serves the wallet API under "/v1/wallet/" (mount it on the
// gateway's TLS listener):
//
//	GET /v1/wallet/key                 public: {"gateway": hex ed25519 key}
//	GET /v1/wallet/statements?after=N  signed (walletapi.SignRequest): the
//	    signer's own statements with N > after as a walletapi.StatementsPage
//
// The statements are those of the key that signed the request, so nobody
// can read another worker's wallet, and there is no method that changes
// one. A missing, stale, forged or replayed signature gets 401; any query
// parameter other than after, or a bad after, 400; other methods 405.
func (s *Service) Handler(opt HandlerOptions) http.Handler {
	if opt.MaxSkew <= 0 {
		opt.MaxSkew = walletapi.DefaultMaxSkew
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	nonces := walletapi.NewNonceCache(2*opt.MaxSkew+time.Second, 0)
	gw := hex.EncodeToString(s.PublicKey())
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+walletapi.PathKey, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, walletapi.KeyInfo{Gateway: gw})
	})
	mux.HandleFunc("GET "+walletapi.PathStatements, func(w http.ResponseWriter, r *http.Request) {
		now := opt.Now()
		pub, nonce, err := walletapi.VerifyRequest(r.Header, r.Method, walletapi.RequestTarget(r), now, opt.MaxSkew)
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		worker := hex.EncodeToString(pub)
		switch err := nonces.Check(worker, nonce, now); {
		case errors.Is(err, walletapi.ErrTooMany):
			w.Header().Set("Retry-After", "60")
			http.Error(w, err.Error(), http.StatusTooManyRequests)
			return
		case errors.Is(err, walletapi.ErrBusy):
			w.Header().Set("Retry-After", "5")
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		case err != nil:
			http.Error(w, walletapi.ErrUnauthorized.Error()+": nonce already used", http.StatusUnauthorized)
			return
		}
		q := r.URL.Query()
		var after uint64
		for k, v := range q {
			if k != "after" || len(v) != 1 {
				http.Error(w, "only one query parameter, after, is accepted", http.StatusBadRequest)
				return
			}
			if after, err = strconv.ParseUint(v[0], 10, 63); err != nil {
				http.Error(w, "after: want a non-negative integer", http.StatusBadRequest)
				return
			}
		}
		sts, more, err := s.Statements(r.Context(), worker, after, walletapi.MaxPage)
		if err != nil {
			http.Error(w, "statements unavailable", http.StatusServiceUnavailable)
			return
		}
		if sts == nil {
			sts = []walletapi.Signed{}
		}
		writeJSON(w, walletapi.StatementsPage{Gateway: gw, Statements: sts, More: more})
	})
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(v) // a failed write means the client went away
}
