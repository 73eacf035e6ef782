package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
)

// logFlags are --log-format and --log-level, shared by the long-running
// roles (hub, gateway).
type logFlags struct {
	format, level string
}

func addLogFlags(fs *flag.FlagSet) *logFlags {
	lf := &logFlags{}
	fs.StringVar(&lf.format, "log-format", "text", "structured log format: text (key=value) or json (one object per line)")
	fs.StringVar(&lf.level, "log-level", "info", "least severe level logged: debug, info, warn, error")
	return lf
}

// logger returns the slog logger the flags describe, writing to w, and
// makes it the default (for the packages that log through slog.Default).
func (lf *logFlags) logger(w io.Writer) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(lf.level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: %w", lf.level, err)
	}
	opts := &slog.HandlerOptions{Level: lv}
	var h slog.Handler
	switch lf.format {
	case "text":
		h = slog.NewTextHandler(w, opts)
	case "json":
		h = slog.NewJSONHandler(w, opts)
	default:
		return nil, fmt.Errorf("--log-format %q: want text or json", lf.format)
	}
	l := slog.New(h)
	slog.SetDefault(l)
	return l, nil
}
