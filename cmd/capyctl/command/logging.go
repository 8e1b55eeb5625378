// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// roleLogger returns a role's logger: readable text on a terminal, one JSON
// object per line otherwise (journal, files). format is auto, text or json.
func roleLogger(level, format string, w io.Writer) hclog.Logger {
	// The log writes its own colours; hclog quotes (text) or encodes
	// (JSON) the values it is given, so it goes to the stream itself, not
	// through the CLI's escaping (termsafe.go).
	w = rawOutput(w)
	jsonFmt := format == "json" || (format != "text" && !isTerminal(w))
	lvl := hclog.LevelFromString(level)
	if lvl == hclog.NoLevel {
		lvl = hclog.Info
	}
	return hclog.New(&hclog.LoggerOptions{
		Name:       "capyctl",
		Level:      lvl,
		Output:     w,
		JSONFormat: jsonFmt,
		Color:      hclog.AutoColor,
	})
}

// devLogger is capyctl dev's logger. On a terminal the banner comes first:
// the terminal gets warnings and errors only, and the whole log (info and
// up) goes to <state>/logs/dev.log, which the banner names (path "" when
// nothing goes to a file). Elsewhere (a pipe, a test, CI) it is the
// role's logger on w, as for start standalone. close ends the file.
func devLogger(stateDir string, w io.Writer) (logger hclog.Logger, path string, closeFn func()) {
	if !isTerminal(w) {
		return roleLogger("info", "auto", w), "", func() {}
	}
	path = filepath.Join(stateDir, "logs", "dev.log")
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return roleLogger("info", "auto", w), "", func() {}
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return roleLogger("info", "auto", w), "", func() {}
	}
	il := hclog.NewInterceptLogger(&hclog.LoggerOptions{Name: "capyctl", Level: hclog.Info, Output: f, JSONFormat: true})
	il.RegisterSink(hclog.NewSinkAdapter(&hclog.LoggerOptions{Name: "capyctl", Level: hclog.Warn, Output: w, Color: hclog.AutoColor}))
	return il, path, func() { _ = f.Close() }
}

// selfCommand is how the person ran capyctl, for the hints a banner
// prints: "capyctl" when PATH finds this binary, else the path they typed
// (bin/capyctl in a source tree).
func selfCommand() string {
	arg := os.Args[0]
	if !strings.Contains(arg, "/") {
		return "capyctl"
	}
	if found, err := lookPathSelf(); err == nil && found {
		return "capyctl"
	}
	return arg
}

// lookPathSelf reports whether "capyctl" on PATH is this very binary.
func lookPathSelf() (bool, error) {
	exe, err := os.Executable()
	if err != nil {
		return false, err
	}
	onPath, err := exec.LookPath("capyctl")
	if err != nil {
		return false, err
	}
	a, errA := os.Stat(exe)
	b, errB := os.Stat(onPath)
	return errA == nil && errB == nil && os.SameFile(a, b), nil
}
