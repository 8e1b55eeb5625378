// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"encoding/json"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/ledger"
	"github.com/capyctl/capyctl/core/placement"
	"github.com/capyctl/capyctl/core/store"
)

// MemoryExtras returns a DeploymentExtras function that adds the placer's
// figures to a deployment's status: the memory object (wire.MemoryView)
// and each instance's charges (and its ledger phase when the lifecycle
// gave none).
func MemoryExtras(p *placement.Placer) func(st *wire.DeploymentStatus) {
	return func(st *wire.DeploymentStatus) {
		mem, owners := p.Memory(st.Name, st.Revision)
		st.Memory = toMap(memoryView(mem))
		for i := range st.Instances {
			o, ok := owners[st.Instances[i].ID]
			withCharges(&st.Instances[i], o, ok)
		}
	}
}

// InstanceCharges sets an instance's charges (and its ledger phase when
// the lifecycle gave none) from the placer's ledger, as a status shows
// them (a host's journal carries the instance so).
func InstanceCharges(p *placement.Placer, is *wire.InstanceStatus) {
	o, ok := p.Owner(is.ID)
	withCharges(is, o, ok)
}

func withCharges(is *wire.InstanceStatus, o ledger.OwnerState, owner bool) {
	if !owner {
		is.Charges = nil
		return
	}
	is.Charges = o.Charges
	if is.Phase == "" {
		is.Phase = o.Phase
	}
}

// HostView returns the host's GPUs and its ledger (wire.LedgerView as the
// generic object wire.Host carries).
func HostView(p *placement.Placer) ([]wire.GPU, map[string]any) {
	h := p.Host()
	gpus := make([]wire.GPU, 0, len(h.GPUs))
	for _, d := range h.GPUs {
		gpus = append(gpus, wire.GPU{Index: d.Index, UUID: d.UUID, Name: d.Name, TotalBytes: d.TotalBytes, UsedBytes: d.UsedBytes, Unified: d.Unified})
	}
	return gpus, toMap(ledgerView(h))
}

// memoryView builds the wire form of a deployment's memory.
func memoryView(m placement.DeploymentMemory) wire.MemoryView {
	var parkedHost *wire.PhaseView
	if m.ParkedHost != (placement.PhaseCharge{}) {
		parkedHost = &wire.PhaseView{DeviceBytes: m.ParkedHost.DeviceBytes, HostBytes: m.ParkedHost.HostBytes, Provenance: m.ParkedHost.Provenance}
	}
	return wire.MemoryView{
		ParkedHost: parkedHost,
		Host:       m.Host, Domain: m.Domain,
		Startup: wire.StartupView{
			DeviceBytes: m.Startup.DeviceBytes, HostBytes: m.Startup.HostBytes,
			DeviceProvenance: m.Startup.DeviceProvenance, HostProvenance: m.Startup.HostProvenance,
			ObservedDeviceBytes: m.Startup.ObservedDeviceBytes, ObservedHostBytes: m.Startup.ObservedHostBytes,
			ObservedSamples: m.Startup.ObservedSamples,
		},
		Ready:    wire.PhaseView{DeviceBytes: m.Ready.DeviceBytes, HostBytes: m.Ready.HostBytes, Provenance: m.Ready.Provenance},
		Parked:   wire.PhaseView{DeviceBytes: m.Parked.DeviceBytes, HostBytes: m.Parked.HostBytes, Provenance: m.Parked.Provenance},
		KVCache:  m.KVCache,
		Weights:  m.Weights,
		Measured: measurement(m.Measured),
		Ledger:   ledgerDomains(m.Ledger),
	}
}

// ledgerView builds the wire form of the host's ledger.
func ledgerView(h placement.HostState) wire.LedgerView {
	v := wire.LedgerView{Epoch: h.Ledger.Epoch, GPU: h.GPUKind, Domains: ledgerDomains(h.Ledger.Domains)}
	if h.Ledger.Owners != nil {
		v.Owners = make([]wire.LedgerOwner, 0, len(h.Ledger.Owners))
		for _, o := range h.Ledger.Owners {
			v.Owners = append(v.Owners, wire.LedgerOwner{ID: o.ID, Phase: o.Phase, Charges: o.Charges, Plan: o.Plan})
		}
	}
	return v
}

// ledgerDomains keeps nil as nil: the object's "ledger" and "domains" read
// null when the ledger has no domain, as they always have.
func ledgerDomains(ds []ledger.DomainState) []wire.LedgerDomain {
	if ds == nil {
		return nil
	}
	out := make([]wire.LedgerDomain, 0, len(ds))
	for _, d := range ds {
		out = append(out, wire.LedgerDomain{
			Name: d.Name, Kind: d.Kind, DeviceUUID: d.DeviceUUID, DeviceName: d.DeviceName,
			Capacity: d.Capacity, ManagedLimit: d.ManagedLimit, FreeReserve: d.FreeReserve, External: d.External,
			Room: d.Room, Charged: d.Charged, Free: d.Free,
		})
	}
	return out
}

func measurement(m *store.Measurement) *wire.Measurement {
	if m == nil {
		return nil
	}
	return &wire.Measurement{DeviceBytes: m.DeviceBytes, HostBytes: m.HostBytes, Provenance: m.Provenance, At: m.At, Samples: m.Samples}
}

// toMap turns a view into the generic JSON object the wire types carry.
func toMap(v any) map[string]any {
	data, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		return nil
	}
	return m
}
