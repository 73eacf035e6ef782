// Package config maps a TOML file onto a command's flag set: every flag of
// a backbone command (hub, gateway, serve, generate, worker, up) is a key of
// the same name, so one file describes a role, or a whole network with one
// table per role:
//
//	[hub]
//	listen = "10.0.0.2:7001"
//	ledger = "postgres://kvasir@db.lan/kvasir"
//	settle = "30s"
//
//	[gateway]
//	listen = ":443"
//	acme-domain = "gate.example.net"
//
// A command started with --config FILE reads the table named after it
// (Parse's section), or the file's top-level keys when the file has no such
// table and no other table either. Flags given on the command line override the
// file. A key that names no flag of the command is an error (a typo is never
// silently ignored). Values may be TOML strings, integers, floats,
// booleans (durations and byte counts as strings: "30s", "4GiB") or arrays,
// which are joined with commas for the list flags (--layers 0,1). The kind
// must fit the flag: a boolean flag takes true or false, a number flag an
// unquoted number, a duration a string; anything else is an error naming
// the key (checkKind).
//
// --print-config prints the command's resulting settings (file, then
// flags) as a TOML table and exits: what the role would run with.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// ErrPrinted is returned by Parse after --print-config printed the
// settings: the command should exit with status 0 without running.
var ErrPrinted = errors.New("config: printed")

// Parse registers --config and --print-config on fs, parses args, then
// sets every flag the command line left unset from the table section of
// the --config file (see the package comment). With --print-config it
// writes the result to stdout and returns ErrPrinted. Errors name the
// file and the key.
func Parse(fs *flag.FlagSet, section string, args []string, stdout io.Writer) error {
	file := fs.String("config", "", "TOML file whose ["+section+"] table (or, in a file with no tables, its top-level keys) sets any flag not given here: one key per flag name (docs/operating.md)")
	print := fs.Bool("print-config", false, "print the resulting settings as TOML and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *file != "" {
		if err := Apply(fs, *file, section); err != nil {
			fmt.Fprintln(fs.Output(), err)
			return err
		}
	}
	if *print {
		if err := Print(stdout, fs, section); err != nil {
			return err
		}
		return ErrPrinted
	}
	return nil
}

// Sections are the tables a configuration file may have: one per command
// that reads it (Parse). Another table name, or a key outside the tables
// in a file that has tables, is a typo, and an error: "[gateways]" would
// otherwise leave the gateway on its defaults (no crediting) without a
// word.
var Sections = []string{"serve", "hub", "gateway", "up", "worker", "generate"}

// Table reads the TOML file at path and returns the keys of its table
// section: the table of that name, or the top-level keys when the file
// has no tables at all. A file without that table (but with others) gives
// an empty map. Errors: the file's, a syntax error, and in a file with
// tables a table not in Sections or a key outside every table (each named
// with the file).
func Table(path, section string) (map[string]any, error) {
	var doc map[string]any
	if _, err := toml.DecodeFile(path, &doc); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	if err := checkSections(path, doc); err != nil {
		return nil, err
	}
	if t, ok := doc[section]; ok {
		m, ok := t.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("config %s: %q is not a table", path, section)
		}
		return m, nil
	}
	tables := false
	for _, v := range doc {
		if _, ok := v.(map[string]any); ok {
			tables = true
		}
	}
	if tables {
		return map[string]any{}, nil
	}
	return doc, nil
}

// Apply sets every flag of fs not set on the command line (fs.Parse ran)
// from the table section of the TOML file at path. A key that names no
// flag of fs, or a value the flag refuses, is an error naming the file,
// table and key.
func Apply(fs *flag.FlagSet, path, section string) error {
	t, err := Table(path, section)
	if err != nil {
		return err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	keys := make([]string, 0, len(t))
	for k := range t {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		f := fs.Lookup(k)
		if f == nil || k == "config" || k == "print-config" {
			return fmt.Errorf("config %s: [%s] %s: not a flag of backbone %s (see backbone %s -h)", path, section, k, fs.Name(), fs.Name())
		}
		if given[k] {
			continue // the command line wins
		}
		if err := checkKind(f, t[k]); err != nil {
			return fmt.Errorf("config %s: [%s] %s = %v: %w", path, section, k, tomlShow(t[k]), err)
		}
		s, err := valueString(t[k])
		if err != nil {
			return fmt.Errorf("config %s: [%s] %s: %w", path, section, k, err)
		}
		if err := fs.Set(k, s); err != nil {
			return fmt.Errorf("config %s: [%s] %s = %q: %w%s", path, section, k, s, err, valueHint(f))
		}
	}
	return nil
}

// checkKind refuses a TOML value of the wrong kind for flag f, where the
// flag's type is known (flag.Getter): a boolean flag takes true or false
// (not 1, not "yes"), a whole-number flag a TOML integer, a number flag an
// integer or float, a duration flag a string ("30s"), a text flag a
// string, an integer or an array (a list such as layers = [0, 1]), not a
// boolean or a fraction. Flags of other types take what valueString
// writes, and refuse it themselves.
func checkKind(f *flag.Flag, v any) error {
	var want any
	if g, ok := f.Value.(flag.Getter); ok {
		want = g.Get()
	}
	_, isArray := v.([]any)
	switch want.(type) {
	case bool:
		if _, ok := v.(bool); !ok {
			return errors.New("want true or false (a TOML boolean)")
		}
	case int, int64, uint, uint64:
		if _, ok := v.(int64); !ok {
			return errors.New("want a whole number (a TOML integer, not quoted)")
		}
	case float64:
		switch v.(type) {
		case int64, float64:
		default:
			return errors.New("want a number (not quoted)")
		}
	case time.Duration:
		if _, ok := v.(string); !ok {
			return errors.New(`want a duration with its unit, as a string: "30s", "5m"`)
		}
	case string:
		// Text, a whole number (layers = 3) or a list (layers = [0, 1]);
		// a boolean or a fraction is no text a flag takes.
		switch v.(type) {
		case bool, float64:
			return errors.New("want text (a TOML string, quoted)")
		}
	default:
		if isArray && want != nil {
			return errors.New("not a list: want a single value")
		}
	}
	return nil
}

// tomlShow is v as the file wrote it, near enough for an error message.
func tomlShow(v any) string {
	if s, ok := v.(string); ok {
		return strconv.Quote(s)
	}
	return fmt.Sprint(v)
}

// valueString is a TOML value as a flag's command-line text.
func valueString(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case bool:
		return strconv.FormatBool(x), nil
	case int64:
		return strconv.FormatInt(x, 10), nil
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64), nil
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			s, err := valueString(e)
			if err != nil {
				return "", err
			}
			parts[i] = s
		}
		return strings.Join(parts, ","), nil
	}
	return "", fmt.Errorf("unsupported value %v (%T): use a string, number, boolean or array", v, v)
}

// Secret names the flags whose values Print never writes (a bearer key):
// a set one is printed as a comment saying so, and applying the output
// again leaves it at its default (the environment variable, for
// --api-key).
var Secret = map[string]bool{"api-key": true}

// Print writes the values of every flag of fs (but --config and
// --print-config) as the TOML table section, sorted by name, each with its
// usage as a comment. Applied again (Apply) the output gives the same
// settings, except for what is not printed: the flags in Secret, and the
// passwords RedactPassword finds (a URL's user:PASSWORD@ or ?password=,
// a key=value connection string's password=...), shown as "xxxxx".
func Print(w io.Writer, fs *flag.FlagSet, section string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "[%s]\n", section)
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name == "config" || f.Name == "print-config" {
			return
		}
		usage := strings.ReplaceAll(f.Usage, "\n", " ")
		if len(usage) > 110 {
			usage = usage[:107] + "..."
		}
		fmt.Fprintf(&b, "# %s\n", usage)
		if _, ok := f.Value.(flag.Getter); !ok && f.Value.String() == "" {
			fmt.Fprintf(&b, "# %s = (its default)\n", f.Name) // a flag.Func that cannot show its value
			return
		}
		if Secret[f.Name] {
			if f.Value.String() == "" {
				fmt.Fprintf(&b, "%s = \"\"\n", f.Name)
			} else {
				fmt.Fprintf(&b, "# %s = (set; a secret, not printed)\n", f.Name)
				fmt.Fprintf(&b, "# ... used as a config, this file leaves %s unset: add it back here or set it in the environment\n", f.Name)
			}
			return
		}
		lit := literal(f.Value)
		if r, ok := RedactPassword(f.Value.String()); ok {
			lit = strconv.Quote(r)
		}
		fmt.Fprintf(&b, "%s = %s\n", f.Name, lit)
	})
	_, err := io.WriteString(w, b.String())
	return err
}

// RedactPassword returns v with every password it holds replaced by
// "xxxxx", and whether it held one: a URL's (scheme://user:PW@host) and
// its password query parameter (?password=PW, which libpq and pgx read
// too), or a libpq key=value connection string's (password=PW, or a quoted
// password = 'P W' with \' and \\ escapes; PostgreSQL docs, "Connection
// Strings"). A URL that does not parse is returned as a placeholder (it
// may hold a password that cannot be found).
func RedactPassword(v string) (string, bool) {
	if strings.Contains(v, "://") {
		u, err := url.Parse(v)
		if err != nil {
			return "(unparsable URL, not shown)", true
		}
		found := false
		if u.User != nil {
			if _, ok := u.User.Password(); ok {
				u.User, found = url.UserPassword(u.User.Username(), "xxxxx"), true
			}
		}
		if q := u.Query(); len(q) > 0 {
			for k := range q {
				if strings.EqualFold(k, "password") {
					q[k], found = []string{"xxxxx"}, true
				}
			}
			if found {
				u.RawQuery = q.Encode()
			}
		}
		if !found {
			return v, false
		}
		return u.String(), true
	}
	var b strings.Builder
	found := false
	for i := 0; i < len(v); {
		// A keyword starts the string or follows white space.
		if (i == 0 || v[i-1] == ' ' || v[i-1] == '\t' || v[i-1] == '\n') && len(v)-i >= 8 && strings.EqualFold(v[i:i+8], "password") {
			j := i + 8
			for j < len(v) && (v[j] == ' ' || v[j] == '\t') {
				j++
			}
			if j < len(v) && v[j] == '=' {
				j++
				for j < len(v) && (v[j] == ' ' || v[j] == '\t') {
					j++
				}
				k := j
				if k < len(v) && v[k] == '\'' {
					for k++; k < len(v) && v[k] != '\''; k++ {
						if v[k] == '\\' {
							k++
						}
					}
					k = min(k+1, len(v))
				} else {
					for k < len(v) && v[k] != ' ' && v[k] != '\t' && v[k] != '\n' {
						k++
					}
				}
				b.WriteString(v[i:j])
				b.WriteString("xxxxx")
				i, found = k, true
				continue
			}
		}
		b.WriteByte(v[i])
		i++
	}
	if !found {
		return v, false
	}
	return b.String(), true
}

// literal is a flag's value as a TOML literal: booleans and numbers bare,
// everything else (durations, byte counts, lists) a quoted string.
func literal(v flag.Value) string {
	if g, ok := v.(flag.Getter); ok {
		switch x := g.Get().(type) {
		case bool:
			return strconv.FormatBool(x)
		case int:
			return strconv.Itoa(x)
		case int64:
			return strconv.FormatInt(x, 10)
		case uint:
			return strconv.FormatUint(uint64(x), 10)
		case uint64:
			return strconv.FormatUint(x, 10)
		case float64:
			return strconv.FormatFloat(x, 'g', -1, 64)
		case time.Duration:
			return strconv.Quote(x.String())
		}
	}
	return strconv.Quote(v.String())
}

// checkSections refuses, in a file that has tables, a table that is not in
// Sections and a key outside every table.
func checkSections(path string, doc map[string]any) error {
	var tables, loose []string
	for k, v := range doc {
		if _, ok := v.(map[string]any); ok {
			tables = append(tables, k)
		} else {
			loose = append(loose, k)
		}
	}
	if len(tables) == 0 {
		return nil // a flat file: one command's keys
	}
	sort.Strings(tables)
	sort.Strings(loose)
	for _, t := range tables {
		if !slices.Contains(Sections, t) {
			return fmt.Errorf("config %s: unknown table [%s] (tables: [%s])", path, t, strings.Join(Sections, "], ["))
		}
	}
	if len(loose) > 0 {
		return fmt.Errorf("config %s: key %q is outside every table: put it in the table of the role it is for", path, loose[0])
	}
	return nil
}

// valueHint says what a flag's value should look like, for an error on a
// value it refused (flag's own error is often just "parse error").
func valueHint(f *flag.Flag) string {
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return ""
	}
	switch g.Get().(type) {
	case time.Duration:
		return ` (want a duration with its unit, as a string: "30s", "5m")`
	case bool:
		return " (want true or false)"
	case int, int64, uint, uint64:
		return " (want a whole number)"
	case float64:
		return " (want a number)"
	}
	return ""
}
