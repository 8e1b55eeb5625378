// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package ledger is the memory arithmetic of one host: its domains (one
// unified pool, or host RAM plus one domain per discrete card), the owners
// charged in them (instances, each with a charge per phase), the admission
// rule, placement forecasts and the sizing formulas that turn a deployment
// into charges. It is pure: no clock, no files, no processes. The placer
// (core/placement) feeds it readings and decisions and keeps it behind a
// lock; a Ledger itself is not safe for concurrent use.
//
// The admission rule (SPEC D1, original ADR 0007): a change is admitted
// when, in every domain it raises, the charges after it stay within the
// domain's room, where
//
//	room = min(managed_limit, capacity − max(free_reserve, external))
//
// and external is what the domain holds outside CapyCTL (a display server,
// the driver's own reservation): it comes out of the free reserve first and
// is never counted twice. An owner's new charge replaces its old one; every
// other owner stays charged. A change that lowers every charge is always
// admitted. Forecasts never mutate the ledger.
package ledger

import (
	"fmt"
	"math"

	"github.com/capyctl/capyctl/core/structs"
)

// Domain kinds.
const (
	// KindUnified is one pool shared by the GPU and the host (GB10-class).
	KindUnified = "unified"
	// KindSystem is host RAM on a machine with discrete cards.
	KindSystem = "system"
	// KindDevice is one discrete card's memory.
	KindDevice = "device"
)

// Well-known domain names; device domains are "gpu<index>".
const (
	DomainUnified = "unified"
	DomainSystem  = "system"
)

// DeviceDomain returns the name of the domain of the card with a CUDA index.
func DeviceDomain(index int) string { return fmt.Sprintf("gpu%d", index) }

// Domain is one memory domain and its limits, all in bytes.
type Domain struct {
	// Name is "unified", "system" or "gpu<index>".
	Name string `json:"name"`
	// Kind is KindUnified, KindSystem or KindDevice.
	Kind string `json:"kind"`
	// DeviceUUID names the card of a device domain (and of a unified pool,
	// when the GPU reports one).
	DeviceUUID string `json:"device_uuid,omitempty"`
	// DeviceName is the card's product name, for people.
	DeviceName string `json:"device_name,omitempty"`
	// Capacity is the domain's whole memory (a card's total, host RAM
	// bounded by the role's cgroup limit).
	Capacity int64 `json:"capacity_bytes"`
	// ManagedLimit is the most CapyCTL may charge in the domain.
	ManagedLimit int64 `json:"managed_limit_bytes"`
	// FreeReserve is what always stays free of CapyCTL's charges.
	FreeReserve int64 `json:"free_reserve_bytes"`
	// External is what the domain holds outside CapyCTL, as last observed
	// (0 when unknown). It comes out of the free reserve first.
	External int64 `json:"external_bytes"`
}

// Room is the most all owners together may be charged in the domain:
// min(managed limit, capacity − max(free reserve, external)), never below 0.
func (d Domain) Room() int64 {
	held := d.FreeReserve
	if d.External > held {
		held = d.External
	}
	room := d.Capacity - held
	if d.ManagedLimit < room {
		room = d.ManagedLimit
	}
	if room < 0 {
		return 0
	}
	return room
}

// Validate refuses limits that do not fit together: a negative figure, a
// managed limit of zero or above the capacity, a reserve at or above the
// capacity, or a managed limit and reserve that add up to more than the
// capacity (the limit could never be reached).
func (d Domain) Validate() error {
	switch {
	case d.Name == "":
		return fmt.Errorf("a domain has no name")
	case d.Kind != KindUnified && d.Kind != KindSystem && d.Kind != KindDevice:
		return fmt.Errorf("domain %s: unknown kind %q", d.Name, d.Kind)
	case d.Capacity <= 0:
		return fmt.Errorf("domain %s: capacity %s is not positive", d.Name, formatBytes(d.Capacity))
	case d.ManagedLimit <= 0:
		return fmt.Errorf("domain %s: managed limit %s is not positive", d.Name, formatBytes(d.ManagedLimit))
	case d.FreeReserve < 0:
		return fmt.Errorf("domain %s: free reserve %s is negative", d.Name, formatBytes(d.FreeReserve))
	case d.External < 0:
		return fmt.Errorf("domain %s: external memory %s is negative", d.Name, formatBytes(d.External))
	case d.ManagedLimit > d.Capacity:
		return fmt.Errorf("domain %s: managed limit %s is above the capacity %s",
			d.Name, formatBytes(d.ManagedLimit), formatBytes(d.Capacity))
	case d.FreeReserve >= d.Capacity:
		return fmt.Errorf("domain %s: free reserve %s leaves nothing of the capacity %s",
			d.Name, formatBytes(d.FreeReserve), formatBytes(d.Capacity))
	case d.ManagedLimit > d.Capacity-d.FreeReserve:
		return fmt.Errorf("domain %s: managed limit %s and free reserve %s add up to more than the capacity %s; the limit could never be reached",
			d.Name, formatBytes(d.ManagedLimit), formatBytes(d.FreeReserve), formatBytes(d.Capacity))
	}
	return nil
}

// addChecked adds two non-negative byte counts, reporting an overflow.
func addChecked(a, b int64) (int64, bool) {
	if b > 0 && a > math.MaxInt64-b {
		return 0, false
	}
	if b < 0 && a < math.MinInt64-b {
		return 0, false
	}
	return a + b, true
}

// formatBytes renders a byte count the way the CLI does ("11GiB", "1.5GiB").
func formatBytes(n int64) string { return structs.FormatBytes(n) }
