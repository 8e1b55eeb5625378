// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"

	"github.com/capyctl/capyctl/core/structs"
)

// What a placement of the server's own (deploy.go, group.go) shares: its
// attempt names, the clauses and refusals it answers with, and the wait
// for the hosts' ledgers.

// newAttempt names one placement attempt: the hosts' idempotency keys are
// the client's key, the host and the attempt, so a retry after a rolled
// back attempt is carried out again rather than replayed from a host that
// undid it (the server's own receipt replays a retry of a success).
func newAttempt() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func hostsClause(ps *structs.PlacementSpec) string {
	if ps == nil || len(ps.Hosts) == 0 {
		return ""
	}
	return "; placement.hosts = " + strings.Join(ps.Hosts, ", ")
}

// allDraining reports whether every named host is joined and draining.
func (s *Server) allDraining(names []string) bool {
	for _, n := range names {
		rec, ok := s.State.Host(n)
		if !ok || !rec.Drained {
			return false
		}
	}
	return true
}

// allCodes reports whether every host refused with code.
func allCodes(refusals map[string]any, code structs.Code) bool {
	for _, v := range refusals {
		if m, _ := v.(map[string]any); m == nil || m["code"] != string(code) {
			return false
		}
	}
	return len(refusals) > 0
}

func describeRefusals(refusals map[string]any) string {
	var parts []string
	for host, v := range refusals {
		m, _ := v.(map[string]any)
		parts = append(parts, fmt.Sprintf("%s: %v", host, m["message"]))
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		return "no host took it"
	}
	return strings.Join(parts, "; ")
}
