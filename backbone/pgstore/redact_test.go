package pgstore

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestRedact: a connection string's password is not shown in logs and
// errors, whether in the URL's user part or as a password query parameter
// (the latter was shown), and Connect's error to a closed port carries the
// redacted form.
func TestRedact(t *testing.T) {
	for dsn, want := range map[string]string{
		"postgres://u:hunter2@h/db":                      "postgres://u:xxxxx@h/db",
		"postgres://u@h/db?password=hunter2":             "postgres://u@h/db?password=xxxxx",
		"postgres://u:hunter2@h/db?password=hunter2&x=1": "postgres://u:xxxxx@h/db?password=xxxxx&x=1",
		"postgres://u@h/db":                              "postgres://u@h/db",
		"postgres://u:%zz@h/db":                          "(unparsable URL, not shown)",
	} {
		if got := Redact(dsn); got != want {
			t.Errorf("Redact(%q) = %q, want %q", dsn, got, want)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := Connect(ctx, "postgres://u@127.0.0.1:1/db?password=hunter8&connect_timeout=2", Options{})
	if err == nil || strings.Contains(err.Error(), "hunter8") || !strings.Contains(err.Error(), "password=xxxxx") {
		t.Fatalf("Connect to a closed port: %v", err)
	}
}
