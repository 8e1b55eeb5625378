// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

// Held is what the lifecycle holds at one moment, read for the role's
// metrics (capyctl_start_slots_in_use, capyctl_engine_port_leases): a role
// with no start under way holds no start slot, and one port lease per
// engine and per LMCache server that runs (or is kept at a park).
type Held struct {
	// StartSlots are the start slots in use, by driver family (families
	// that never started anything are absent).
	StartSlots map[string]int
	// SlotsPerFamily is each family's bound (max_concurrent_effects).
	SlotsPerFamily int
	// PortLeases are the loopback ports leased to engines and LMCache
	// servers.
	PortLeases int
}

// Held returns what the lifecycle holds now.
func (m *Manager) Held() Held {
	h := Held{StartSlots: map[string]int{}, SlotsPerFamily: m.cfg.MaxConcurrentEffects}
	m.slotsMu.Lock()
	for family, sem := range m.slots {
		h.StartSlots[family] = len(sem)
	}
	m.slotsMu.Unlock()
	if m.cfg.Ports != nil {
		h.PortLeases = m.cfg.Ports.Leased()
	}
	return h
}
