// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"slices"

	"github.com/capyctl/capyctl/core/structs"
)

// inTheWayOn reports whether group p may be evicted for a capacity
// refusal e: only when p has a member on the host that refused (the
// refusal's "host" detail, which the server sets on every host's answer
// over whatever the host sent: hostError, waitStarted, withGroupsOn). A
// host's refusal is its word about its own memory: it names the groups in
// the way there, and no other; a refusal that names a group without a
// member on that host (a compromised host's, or a stale one) evicts
// nothing (the fleet-trust review's L10: a capacity refusal on one host
// parked groups on others).
func (s *Server) inTheWayOn(p *Placement, e *structs.Error, requester string) bool {
	host, _ := e.Details["host"].(string)
	if host != "" && slices.Contains(p.Group.Hosts, host) {
		return true
	}
	s.logger.Warn("a capacity refusal named a group with no member on the refusing host; not evicted",
		"group", p.Deployment, "for", requester, "host", host, "group_hosts", p.Group.Hosts)
	return false
}
