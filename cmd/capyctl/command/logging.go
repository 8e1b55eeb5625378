// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"io"

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
