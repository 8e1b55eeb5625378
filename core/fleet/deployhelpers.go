// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
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

func sumShares(shares []HostShare) int {
	n := 0
	for _, s := range shares {
		n += s.Instances
	}
	return n
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

// waitAdmitted waits until every instance of a deployment a host just
// took is admitted by its ledger (started with a ledger phase, or ready),
// or one was refused
// (stopped or failed with an error): that refusal is returned.
func (s *Server) waitAdmitted(ctx context.Context, host, name string) error {
	deadline := time.NewTimer(admitWait)
	defer deadline.Stop()
	for {
		changes := s.hostIO.changes([]string{host})
		status, data, err := s.hostCall(ctx, host, http.MethodGet, "/deployments/"+url.PathEscape(name), nil, nil)
		if err != nil {
			return err
		}
		var st wire.DeploymentStatus
		if status != http.StatusOK || json.Unmarshal(data, &st) != nil {
			return hostError(host, status, data)
		}
		admitted := 0
		for _, in := range st.Instances {
			switch {
			// The start records its ledger phase once the ledger granted it
			// (a deployment that states no memory is charged nothing).
			case in.State == string(structs.StateReady) || len(in.Charges) > 0 ||
				(in.State == string(structs.StateStarting) && in.Phase != ""):
				admitted++
			case (in.State == string(structs.StateStopped) || in.State == string(structs.StateFailed)) && in.LastError != nil:
				return structs.Errf(in.LastError.Code, "host %s: %s", host, in.LastError.Message).WithDetail("host", host)
			}
		}
		if len(st.Instances) > 0 && admitted == len(st.Instances) {
			return nil
		}
		if expired, err := changes.wait(ctx, deadline.C); expired || err != nil {
			return err
		}
	}
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
