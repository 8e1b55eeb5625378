// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package command holds capyctl's commands, one file per command
// (<noun>_<verb>.go), registered in commands.go.
package command

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mattn/go-isatty"

	"github.com/capyctl/capyctl/core/api/client"
	"github.com/capyctl/capyctl/core/structs"
)

// Meta is shared by every command: output streams, the state directory,
// output format, and the client of the running role.
type Meta struct {
	Out io.Writer
	Err io.Writer
	In  io.Reader

	// Getenv reads the environment (tests inject one).
	Getenv func(string) string
	// Now reads the clock for ages and expiries (nil: time.Now; tests
	// inject one).
	Now func() time.Time

	stateDir string
	jsonOut  bool
	format   string
}

// newMeta returns a Meta on the process's streams.
func newMeta() *Meta {
	return &Meta{Out: os.Stdout, Err: os.Stderr, In: os.Stdin, Getenv: os.Getenv}
}

// FlagSet returns a flag set with the global options.
func (m *Meta) FlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&m.stateDir, "state-dir", "", "")
	fs.BoolVar(&m.jsonOut, "json", false, "")
	fs.StringVar(&m.format, "format", "", "")
	return fs
}

// GeneralOptions is the help text of the global options.
const GeneralOptions = `General Options:

  --state-dir DIR   The role's state directory (env CAPYCTL_STATE_DIR,
                    default $XDG_STATE_HOME/capyctl or ~/.local/state/capyctl).
  --json            Print JSON (indented on a terminal, one line when piped).
  --format text|json
                    Same as --json when json.
`

// JSON reports whether JSON output was asked for.
func (m *Meta) JSON() bool { return m.jsonOut || m.format == "json" }

// StateDir returns the state directory: the flag, CAPYCTL_STATE_DIR, or the
// per-user default.
func (m *Meta) StateDir() string {
	if m.stateDir != "" {
		return m.stateDir
	}
	if v := m.Getenv("CAPYCTL_STATE_DIR"); v != "" {
		return v
	}
	return DefaultStateDir(m.Getenv)
}

// DefaultStateDir is $XDG_STATE_HOME/capyctl or ~/.local/state/capyctl.
func DefaultStateDir(getenv func(string) string) string {
	if x := getenv("XDG_STATE_HOME"); x != "" {
		return filepath.Join(x, "capyctl")
	}
	home := getenv("HOME")
	if home == "" {
		home, _ = os.UserHomeDir()
	}
	return filepath.Join(home, ".local", "state", "capyctl")
}

// Client finds the running role through the state directory.
func (m *Meta) Client() (*client.Client, error) {
	c, _, err := client.Discover(m.StateDir())
	return c, err
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := rawOutput(w).(*os.File)
	return ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
}

// PrintJSON writes v as JSON: indented on a terminal, one line when piped.
func (m *Meta) PrintJSON(v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if isTerminal(m.Out) {
		enc.SetIndent("", "  ")
	}
	_ = enc.Encode(v)
	_, _ = m.Out.Write(buf.Bytes())
}

// Table writes rows under a header, aligned.
func (m *Meta) Table(header []string, rows [][]string) {
	tw := tabwriter.NewWriter(m.Out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	_ = tw.Flush()
}

// Fail prints an error with its code and returns the code's exit status:
// "error [<code>]: <message>" on stderr, or the JSON envelope with --json.
func (m *Meta) Fail(err error) int {
	e := structs.AsError(err)
	if m.JSON() {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		body := map[string]any{"code": string(e.Code), "message": e.Message, "retryable": e.Info().Retryable}
		if len(e.Details) > 0 {
			body["details"] = e.Details
		}
		_ = enc.Encode(map[string]any{"error": body})
		_, _ = m.Err.Write(buf.Bytes())
	} else {
		fmt.Fprintf(m.Err, "error [%s]: %s\n", e.Code, e.Message)
	}
	return e.Info().Exit
}

// Usage reports a usage error (exit 2).
func (m *Meta) Usage(format string, args ...any) int {
	return m.Fail(structs.Errf(structs.CodeInvalidRequest, format, args...))
}

// parse parses flags anywhere among the arguments (`start deployment NAME
// --wait` and `start deployment --wait NAME` alike), turning a flag error
// into exit 2. "--" ends the flags.
func (m *Meta) parse(fs *flag.FlagSet, args []string) ([]string, int) {
	var flags, positional []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			positional = append(positional, args[i+1:]...)
			break
		}
		if len(a) > 1 && a[0] == '-' {
			flags = append(flags, a)
			name := strings.TrimLeft(a, "-")
			if strings.Contains(name, "=") {
				continue
			}
			if f := fs.Lookup(name); f != nil {
				if bf, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && bf.IsBoolFlag() {
					continue
				}
				if i+1 < len(args) {
					flags = append(flags, args[i+1])
					i++
				}
			}
			continue
		}
		positional = append(positional, a)
	}
	if err := fs.Parse(flags); err != nil {
		if err == flag.ErrHelp {
			return nil, -1
		}
		return nil, m.Usage("%v", err)
	}
	switch m.format {
	case "", "text", "json":
	default:
		format := m.format
		m.format = ""
		return nil, m.Usage("--format %q is not an output format: use text or json", format)
	}
	return positional, 0
}

// now returns the current time from the injected clock.
func (m *Meta) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}

// ctx returns the command's context.
func (m *Meta) ctx() context.Context { return context.Background() }

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// kvList is a repeatable K=V flag.
type kvList map[string]string

func (s kvList) String() string { return "" }
func (s kvList) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("%q is not K=V", v)
	}
	s[k] = val
	return nil
}
