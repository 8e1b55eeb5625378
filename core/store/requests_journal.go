// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// The request ledger's journal holds one line per record written and not
// yet folded into the store: its key in the store, a space, its JSON (which
// never holds a raw newline), a newline. A crash can leave a torn last
// line, which parseJournal ignores; a bad line within (a failed append
// whose cut also failed) is skipped, and the lines after it are read.

// parseJournal returns the journal's whole records, oldest first.
func parseJournal(data []byte) []journaled {
	var out []journaled
	for len(data) > 0 {
		nl := bytes.IndexByte(data, '\n')
		if nl < 0 {
			break
		}
		line := data[:nl]
		data = data[nl+1:]
		sp := bytes.IndexByte(line, ' ')
		if sp <= 0 {
			continue
		}
		seq, err := strconv.ParseUint(string(line[:sp]), 10, 64)
		if err != nil || seq == 0 {
			continue
		}
		raw := line[sp+1:]
		var head struct {
			Deployment string `json:"deployment"`
		}
		if err := json.Unmarshal(raw, &head); err != nil {
			continue
		}
		out = append(out, journaled{seq: seq, deployment: head.Deployment, raw: raw})
	}
	return out
}
