package status

import (
	"fmt"
	"regexp"
	"strings"
	"time"
)

// Problem kinds ExplainDial tells apart.
const (
	ProblemDNS     = "dns"     // the gateway's name does not resolve
	ProblemNetwork = "network" // no route: no network, or the network is down
	ProblemRefused = "refused" // nothing listens at the gateway's address
	ProblemTimeout = "timeout" // no answer in time
	ProblemTLS     = "tls"     // the TLS handshake failed or the certificate is not trusted
	ProblemGateway = "gateway" // the gateway answered but would not connect the worker (HTTP status)
	ProblemOther   = "other"
)

// ExplainDial turns a worker's connection error (Snapshot.LastError, as the
// dialer wrote it) into a sentence for the owner that says what failed and
// what to check, and its kind (Problem*). gateway is the gateway's
// host[:port] for the sentence. An empty error gives "", "".
func ExplainDial(gateway, lastError string) (kind, text string) {
	if lastError == "" {
		return "", ""
	}
	if gateway == "" {
		gateway = "the gateway"
	}
	e := strings.ToLower(lastError)
	has := func(subs ...string) bool {
		for _, s := range subs {
			if strings.Contains(e, s) {
				return true
			}
		}
		return false
	}
	switch {
	case has("no such host", "server misbehaving", "temporary failure in name resolution", "no address associated",
		"dns", "lookup ") && !has("x509", "tls:"):
		return ProblemDNS, "cannot find " + gateway + ": its name does not resolve (no internet connection, or DNS is failing)"
	case has("network is unreachable", "no route to host", "host is down", "network is down"):
		return ProblemNetwork, "no network: " + gateway + " cannot be reached (is this device online?)"
	case has("connection refused", "actively refused"):
		return ProblemRefused, gateway + " refused the connection: the gateway is down or the address is wrong"
	case has("unknown authority", "certificate signed by unknown"):
		return ProblemTLS, "TLS: " + gateway + "'s certificate is not signed by an authority this device trusts " +
			"(for a private gateway, give its CA file: Settings in the window, --ca FILE headless)"
	case has("certificate is valid for", "not valid for any names", "doesn't contain any ip sans"):
		return ProblemTLS, "TLS: " + gateway + "'s certificate is for another name (check the gateway address)"
	case has("certificate has expired", "expired", "not yet valid"):
		return ProblemTLS, "TLS: " + gateway + "'s certificate has expired or is not valid yet (check this device's clock)"
	case has("server gave http response to https client"):
		return ProblemTLS, gateway + " speaks plain HTTP on that port, not TLS: the address names another service or port (the gateway's is usually 443)"
	case has("x509:", "tls:", "tls handshake", "first record does not look like a tls"):
		return ProblemTLS, "TLS: the secure connection to " + gateway + " failed (a proxy or firewall may intercept it)"
	case has("i/o timeout", "deadline exceeded", "timed out", "timeout"):
		return ProblemTimeout, gateway + " did not answer in time (slow or filtered network)"
	}
	if m := httpStatus.FindStringSubmatch(lastError); m != nil {
		return ProblemGateway, gateway + " answered HTTP " + m[1] + ": " + gatewayHint(m[1])
	}
	return ProblemOther, "cannot reach " + gateway + ": " + lastError
}

var httpStatus = regexp.MustCompile(`\b([45]\d\d) [A-Z][A-Za-z ]+`)

func gatewayHint(code string) string {
	switch code {
	case "401", "403":
		return "it did not accept this worker's identity"
	case "502", "503", "504":
		return "the gateway is up but the swarm behind it is not available right now"
	case "404":
		return "no worker endpoint there (check the gateway address)"
	}
	return "the gateway would not connect this worker"
}

// retryIn matches the worker's reason while it waits to redial
// ("reconnecting in 1.234s: ...", "refused: ...; retrying in 30s (...)").
var retryIn = regexp.MustCompile(`(?:reconnecting|retrying) in ([0-9.]+(?:ms|s|m)[0-9.ms]*)`)

// DialReason is the reason to show while the worker redials after lastError
// (reason is the worker's own, which carries the backoff delay): the
// ExplainDial sentence and "retrying in D". It returns reason unchanged
// when there is no error to explain.
func DialReason(gateway, reason, lastError string) string {
	_, text := ExplainDial(gateway, lastError)
	if text == "" {
		return reason
	}
	if m := retryIn.FindStringSubmatch(reason); m != nil {
		return text + "; retrying in " + m[1]
	}
	return text + "; retrying"
}

// DialReasonAt is DialReason for a reason the worker set elapsed ago: the
// backoff delay it names counts down ("retrying in 8 s", then "retrying
// now"), instead of repeating the delay as it was when set.
func DialReasonAt(gateway, reason, lastError string, elapsed time.Duration) string {
	_, text := ExplainDial(gateway, lastError)
	if text == "" {
		return reason
	}
	m := retryIn.FindStringSubmatch(reason)
	if m == nil {
		return text + "; retrying"
	}
	d, err := time.ParseDuration(m[1])
	if err != nil {
		return text + "; retrying in " + m[1]
	}
	left := d - elapsed
	if left <= 0 {
		return text + "; retrying now"
	}
	return fmt.Sprintf("%s; retrying in %d s", text, int((left+time.Second-1)/time.Second))
}
