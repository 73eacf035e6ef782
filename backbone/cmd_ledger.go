package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvasir-ai/kvasir/backbone/credit"
	"github.com/kvasir-ai/kvasir/backbone/hub"
	"github.com/kvasir-ai/kvasir/backbone/ledger"
	"github.com/kvasir-ai/kvasir/wallet"
	"github.com/kvasir-ai/kvasir/wallet/walletapi"
)

func init() {
	register("ledger", "print per-worker totals of a hub's contribution ledger", func(args []string) int {
		return ledgerMain(args, os.Stdout, os.Stderr)
	})
	register("wallets", "print the KVR a gateway credited to each worker", func(args []string) int {
		return walletsMain(args, os.Stdout, os.Stderr)
	})
}

// ledgerJSON is the --json output of `backbone ledger`:
// {"workers":[{"id":..,"bytes":..,"rejected_bytes":..}]}; bytes are creditable.
type ledgerJSON struct {
	Workers []ledgerWorkerJSON `json:"workers"`
}

type ledgerWorkerJSON struct {
	ID            string `json:"id"`             // hex ed25519 public key
	Address       string `json:"address"`        // wallet address of the key
	Bytes         uint64 `json:"bytes"`          // creditable bytes
	RejectedBytes uint64 `json:"rejected_bytes"` // never paid
	Sessions      int    `json:"sessions"`
}

// ledgerMain implements
//
//	backbone ledger --db FILE|postgres://... [--json]
func ledgerMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ledger", flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := fs.String("db", "", "the hub's --ledger: an SQLite file or a postgres:// URL (read only)")
	asJSON := fs.Bool("json", false, `print {"workers":[{"id","bytes","rejected_bytes",...}]}`)
	if err := fs.Parse(args); err != nil {
		return parseExit(err)
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "ledger: unexpected arguments %q (the file is given with --db)\n", fs.Args())
		return 2
	}
	if *db == "" {
		fmt.Fprintln(stderr, "ledger: --db FILE|postgres://... is required")
		fs.Usage()
		return 2
	}
	l, err := ledger.OpenReadOnly(*db) // never writes: no schema, no WAL switch, no -wal/-shm
	if err != nil {
		fmt.Fprintf(stderr, "ledger: %v\n", err)
		return 1
	}
	defer l.Close()
	tot, err := l.Totals()
	if err != nil {
		fmt.Fprintf(stderr, "ledger: %v\n", err)
		return 1
	}
	out := ledgerJSON{Workers: []ledgerWorkerJSON{}}
	for _, t := range tot {
		out.Workers = append(out.Workers, ledgerWorkerJSON{ID: t.ID, Address: wallet.AddressOfHex(t.ID), Bytes: t.Bytes, RejectedBytes: t.RejectedBytes, Sessions: t.Sessions})
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			return 1
		}
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "WORKER\tADDRESS\tSESSIONS\tBYTES\tUNITS\tREJECTED BYTES\t")
	var sb, sr uint64
	for _, w := range out.Workers {
		fmt.Fprintf(tw, "%s…\t%s\t%d\t%d\t%s\t%d\t\n", w.ID[:16], w.Address, w.Sessions, w.Bytes, walletapi.FormatUnits(w.Bytes), w.RejectedBytes)
		sb += w.Bytes
		sr += w.RejectedBytes
	}
	fmt.Fprintf(tw, "total\t\t\t%d\t%s\t%d\t\n", sb, walletapi.FormatUnits(sb), sr)
	if err := tw.Flush(); err != nil {
		return 1
	}
	return 0
}

// walletsMain implements
//
//	backbone wallets --db FILE|postgres://... [--json]
//
// printing the gateway's wallets (its --wallets): per worker the credited
// bytes and nKVR, and the crediting cursor.
func walletsMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("wallets", flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := fs.String("db", "", "the gateway's --wallets: an SQLite file or a postgres:// URL (read only)")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return parseExit(err)
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "wallets: unexpected arguments %q (the file is given with --db)\n", fs.Args())
		return 2
	}
	if *db == "" {
		fmt.Fprintln(stderr, "wallets: --db FILE|postgres://... is required")
		fs.Usage()
		return 2
	}
	s, err := credit.OpenReadOnly(*db) // never writes: no seed, no WAL switch, no -wal/-shm
	if err != nil {
		fmt.Fprintf(stderr, "wallets: %v\n", err)
		return 1
	}
	defer s.Close()
	ws, err := s.Wallets()
	cur, cerr := s.Cursor()
	if err = errors.Join(err, cerr); err != nil {
		fmt.Fprintf(stderr, "wallets: %v\n", err)
		return 1
	}
	if *asJSON {
		if ws == nil {
			ws = []credit.Wallet{}
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(map[string]any{"gateway": hex.EncodeToString(s.PublicKey()), "cursor": cur, "wallets": ws}); err != nil {
			return 1
		}
		return 0
	}
	fmt.Fprintf(stdout, "gateway key %s, credited up to ledger id %d\n", hex.EncodeToString(s.PublicKey()), cur)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "ADDRESS\tUNITS\tCREDITED\tREJECTED BYTES\tSTATEMENTS\t")
	for _, w := range ws {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t\n", wallet.AddressOfHex(w.Worker), walletapi.FormatUnits(w.Bytes), walletapi.FormatKVR(w.NKVR), w.RejectedBytes, w.Statements)
	}
	if err := tw.Flush(); err != nil {
		return 1
	}
	return 0
}

// creditFlags are the gateway's crediting flags (--wallets,
// --rate-nkvr-per-byte), registered by addCreditFlags.
type creditFlags struct {
	wallets *string
	rate    *uint64
	every   *time.Duration

	registry prometheus.Registerer // receives the crediting metrics (nil: none)
}

// addCreditFlags registers the crediting flags on the gateway's flag set.
func addCreditFlags(fs *flag.FlagSet) *creditFlags {
	return &creditFlags{
		wallets: fs.String("wallets", "", "wallets: an SQLite file, or a postgres:// URL of a database several gateways share (password: PGPASSWORD or ~/.pgpass); credit workers from the hub's ledger and serve /v1/wallet/ (\"\": no crediting)"),
		rate:    fs.Uint64("rate-nkvr-per-byte", walletapi.DefaultRateNKVRPerByte, "price in nKVR per creditable byte (7 = 0.007 KVR per 10^6 bytes)"),
		every:   fs.Duration("credit-every", time.Second, "how often to poll the hub's ledger"),
	}
}

// start is credit.StartFromHub with the flags: crediting from the hub
// at hubAddr into --wallets every --credit-every, its metrics on
// c.registry.
func (c *creditFlags) start(ctx context.Context, hubAddr string, secret []byte, logf func(string, ...any)) (*credit.Crediting, error) {
	sign := func(r *http.Request) error {
		hub.SignGateway(r.Header, secret, "", time.Now())
		return nil
	}
	return credit.StartFromHub(ctx, credit.HubConfig{Wallets: *c.wallets, Hub: hubAddr, Sign: sign,
		RateNKVRPerByte: *c.rate, Every: *c.every, Registry: c.registry, Logf: logf})
}
