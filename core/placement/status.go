// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package placement

import (
	"github.com/capyctl/capyctl/core/gpu"
	"github.com/capyctl/capyctl/core/ledger"
	"github.com/capyctl/capyctl/core/store"
)

// PhaseCharge is one phase's charge and where its figure came from.
type PhaseCharge struct {
	DeviceBytes int64
	HostBytes   int64
	Provenance  string
}

// StartupCharge is the startup charge with a provenance per side, and what
// a start in progress has measured so far.
type StartupCharge struct {
	DeviceBytes int64
	HostBytes   int64
	// DeviceProvenance and HostProvenance: placeholder, derived, declared,
	// measured or whole_host.
	DeviceProvenance string
	HostProvenance   string
	// Observed* are the peaks sampled so far while an instance starts.
	ObservedDeviceBytes int64
	ObservedHostBytes   int64
	ObservedSamples     int
}

// DeploymentMemory is a deployment's memory: where its last start was
// placed, its charge in each phase, the stored measurement, and the host's
// ledger. core/api publishes it as the status's "memory" object
// (wire.MemoryView).
type DeploymentMemory struct {
	Host string
	// Domain is where the last start was placed ("gpu0", "unified", or
	// "system" on a host without GPUs).
	Domain  string
	Startup StartupCharge
	Ready   PhaseCharge
	Parked  PhaseCharge
	// ParkedHost is zero where a park cannot keep the weights in host RAM.
	ParkedHost PhaseCharge
	KVCache    int64
	Weights    int64
	Measured   *store.Measurement
	// Ledger is the host's ledger: every domain's capacity, limit,
	// reserve, charges and what is free.
	Ledger []ledger.DomainState
}

// Memory returns a deployment's memory, and each of its instances'
// charges and phases by instance ID.
func (p *Placer) Memory(name string, revision uint64) (DeploymentMemory, map[string]ledger.OwnerState) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refreshDevices()
	mv := DeploymentMemory{Host: p.cfg.Host, Ledger: p.l.Snapshot().Domains}
	v := p.views[name]
	if v != nil {
		s := v.Sizing
		mv.Domain = v.Card
		if v.Card == "" {
			mv.Domain = ledger.DomainSystem
			if p.unified() {
				mv.Domain = ledger.DomainUnified
			}
		}
		mv.Startup = StartupCharge{
			DeviceBytes: s.Startup.Device, HostBytes: s.Startup.Host,
			DeviceProvenance: s.StartupDeviceProvenance, HostProvenance: s.StartupHostProvenance,
		}
		mv.Ready = PhaseCharge{DeviceBytes: s.Ready.Device, HostBytes: s.Ready.Host, Provenance: s.ReadyProvenance}
		mv.Parked = PhaseCharge{DeviceBytes: s.Parked.Device, HostBytes: s.Parked.Host, Provenance: s.ParkedProvenance}
		if s.ParkedHost != (ledger.Need{}) && !p.unified() {
			mv.ParkedHost = PhaseCharge{DeviceBytes: s.ParkedHost.Device, HostBytes: s.ParkedHost.Host, Provenance: s.ParkedProvenance}
		}
		mv.KVCache, mv.Weights = s.KVCache, s.Weights
		if v.Key != "" {
			mv.Measured = p.measurement(v.Key)
		}
	}
	owners := map[string]ledger.OwnerState{}
	for id, info := range p.owners {
		if info.Deployment != name {
			continue
		}
		if st, ok := p.l.Owner(id); ok {
			owners[id] = st
		}
		if s := p.samples[id]; s != nil {
			dev, host, n := s.peak()
			mv.Startup.ObservedDeviceBytes = max(mv.Startup.ObservedDeviceBytes, dev)
			mv.Startup.ObservedHostBytes = max(mv.Startup.ObservedHostBytes, host)
			mv.Startup.ObservedSamples += n
		}
	}
	return mv, owners
}

// HostState is the host's GPUs as last read, the GPU provider's kind and
// the ledger at one epoch. core/api publishes it in the hosts list
// (wire.Host, wire.LedgerView).
type HostState struct {
	GPUs    []gpu.Device
	GPUKind string
	Ledger  ledger.Snapshot
}

// Host returns the host's GPUs and ledger, refreshing what the GPUs hold
// outside CapyCTL.
func (p *Placer) Host() HostState {
	devs, err := p.cfg.GPU.Devices()
	if err != nil {
		p.logger.Warn("could not read the gpus", "error", err)
	}
	p.mu.Lock()
	if err == nil {
		p.refreshExternal(devs)
	}
	snap := p.l.Snapshot()
	p.mu.Unlock()
	return HostState{GPUs: devs, GPUKind: p.cfg.GPU.Kind(), Ledger: snap}
}

// Provider returns the GPU provider the placer reads.
func (p *Placer) Provider() gpu.Provider { return p.cfg.GPU }
