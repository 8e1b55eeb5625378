// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package hostagent

import (
	"encoding/json"
	"os"
	"path/filepath"

	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
)

// learn takes the cluster's servers one server told this host (in its
// Welcome, or when the configuration changed) and runs a link and a relay
// to every member, stops those to servers no longer members. The primary
// server (o.Server) is always kept: it is the first contact and the
// fallback when the others are unknown.
func (h *Host) learn(l *serverLink, cs *hostv1.ClusterServers) {
	if cs == nil || cs.GetSelf() == "" {
		return // a server alone
	}
	h.mu.Lock()
	l.name = cs.GetSelf()
	h.members = cs.GetServers()
	h.mu.Unlock()
	h.saveServers()
	h.reconcile()
}

// reconcile starts and stops the links to the other servers to match the
// members last learned (nothing before Run).
func (h *Host) reconcile() {
	h.mu.Lock()
	defer h.mu.Unlock()
	ctx := h.runCtx
	if ctx == nil || ctx.Err() != nil {
		return
	}
	want := map[string]string{}
	for _, m := range h.members {
		if m.GetName() == "" || m.GetAddress() == "" || m.GetName() == h.primary.name || m.GetAddress() == h.primary.addr {
			continue
		}
		if h.primary.name == "" && len(h.members) > 0 && h.primary.addr != "" {
			// The primary's name is not known yet: an address that may be
			// its own under another spelling would make two links from this
			// host to one server, each ending the other's.
			continue
		}
		want[m.GetName()] = m.GetAddress()
	}
	for name, l := range h.others {
		if addr, ok := want[name]; !ok || addr != l.addr {
			l.cancel()
			delete(h.others, name)
			h.logger.Info("stopped the link to a server no longer in the cluster", "server", name, "address", l.addr)
		}
	}
	for name, addr := range want {
		if h.others[name] != nil {
			continue
		}
		l := newServerLink(addr, false)
		l.name = name
		h.others[name] = l
		h.startLocked(ctx, l)
		h.logger.Info("linking to another server of the cluster", "server", name, "address", addr)
	}
}

// knownServers is the file that remembers the cluster's servers across a
// host's restarts (owner-only, beside its credentials): a host whose own
// server is down at its start still reaches the others.
func (h *Host) knownServers() string { return filepath.Join(hostPKIDir(h.o.StateDir), "servers.json") }

type knownServers struct {
	Primary string                  `json:"primary"`
	Servers []*hostv1.ClusterServer `json:"servers"`
}

func (h *Host) loadServers() {
	data, err := os.ReadFile(h.knownServers())
	if err != nil {
		return
	}
	var ks knownServers
	if json.Unmarshal(data, &ks) == nil {
		h.primary.name, h.members = ks.Primary, ks.Servers
	}
}

func (h *Host) saveServers() {
	h.mu.Lock()
	data := mustJSON(knownServers{Primary: h.primary.name, Servers: h.members})
	h.mu.Unlock()
	tmp := h.knownServers() + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err == nil {
		err = os.Rename(tmp, h.knownServers())
		if err != nil {
			h.logger.Debug("remember the cluster's servers", "error", err)
		}
	}
}

// Linked reports whether a link to a server is up now, and the primary
// server's last error.
func (h *Host) Linked() (bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	up := h.primary.linked
	for _, l := range h.others {
		up = up || l.linked
	}
	return up, h.primary.lastErr
}

// Servers reports each server this host keeps a link to, by address, and
// whether that link is up now.
func (h *Host) Servers() map[string]bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string]bool{h.primary.addr: h.primary.linked}
	for _, l := range h.others {
		out[l.addr] = l.linked
	}
	return out
}

// Welcomed is closed once the server first accepted the host's link.
func (h *Host) Welcomed() <-chan struct{} { return h.welcomed }
