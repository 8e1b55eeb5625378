// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package placement

import (
	"encoding/json"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/gpu"
	"github.com/capyctl/capyctl/core/ledger"
	"github.com/capyctl/capyctl/core/store"
)

// PhaseView is one phase's charge in a status.
type PhaseView struct {
	DeviceBytes int64  `json:"device_bytes"`
	HostBytes   int64  `json:"host_bytes"`
	Provenance  string `json:"provenance,omitempty"`
}

// StartupView is the startup charge with a provenance per side, and what
// a start in progress has measured so far.
type StartupView struct {
	DeviceBytes int64 `json:"device_bytes"`
	HostBytes   int64 `json:"host_bytes"`
	// DeviceProvenance and HostProvenance: placeholder, derived, declared,
	// measured or whole_host.
	DeviceProvenance string `json:"device_provenance"`
	HostProvenance   string `json:"host_provenance"`
	// Observed* are the peaks sampled so far while an instance starts.
	ObservedDeviceBytes int64 `json:"observed_device_bytes,omitempty"`
	ObservedHostBytes   int64 `json:"observed_host_bytes,omitempty"`
	ObservedSamples     int   `json:"observed_samples,omitempty"`
}

// MemoryView is a deployment's memory in `status deployment` (its "memory"
// object).
type MemoryView struct {
	Host string `json:"host"`
	// Domain is where the last start was placed ("gpu0", "unified", or
	// "system" on a host without GPUs).
	Domain   string             `json:"domain,omitempty"`
	Startup  StartupView        `json:"startup"`
	Ready    PhaseView          `json:"ready"`
	Parked   PhaseView          `json:"parked"`
	KVCache  int64              `json:"kv_cache_bytes,omitempty"`
	Weights  int64              `json:"weights_bytes,omitempty"`
	Measured *store.Measurement `json:"measured,omitempty"`
	// Ledger is the host's ledger: every domain's capacity, limit,
	// reserve, charges and what is free.
	Ledger []ledger.DomainState `json:"ledger"`
}

// Memory returns a deployment's memory view, and each of its instances'
// charges and phases by instance ID.
func (p *Placer) Memory(name string, revision uint64) (MemoryView, map[string]ledger.OwnerState) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refreshDevices()
	mv := MemoryView{Host: p.cfg.Host, Ledger: p.l.Snapshot().Domains}
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
		mv.Startup = StartupView{
			DeviceBytes: s.Startup.Device, HostBytes: s.Startup.Host,
			DeviceProvenance: s.StartupDeviceProvenance, HostProvenance: s.StartupHostProvenance,
		}
		mv.Ready = PhaseView{DeviceBytes: s.Ready.Device, HostBytes: s.Ready.Host, Provenance: s.ReadyProvenance}
		mv.Parked = PhaseView{DeviceBytes: s.Parked.Device, HostBytes: s.Parked.Host, Provenance: s.ParkedProvenance}
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

// DeploymentExtras fills a status with the deployment's memory view and
// each instance's charges (api.Backend.DeploymentExtras).
func (p *Placer) DeploymentExtras(st *wire.DeploymentStatus) {
	mv, owners := p.Memory(st.Name, st.Revision)
	st.Memory = toMap(mv)
	for i := range st.Instances {
		if o, ok := owners[st.Instances[i].ID]; ok {
			st.Instances[i].Charges = o.Charges
			if st.Instances[i].Phase == "" {
				st.Instances[i].Phase = o.Phase
			}
		} else {
			st.Instances[i].Charges = nil
		}
	}
}

// LedgerView is the host's ledger (GET /management/v1/hosts/{name}/ledger
// and the hosts list).
type LedgerView struct {
	Epoch   uint64               `json:"epoch"`
	GPU     string               `json:"gpu_provider"`
	Domains []ledger.DomainState `json:"domains"`
	Owners  []ledger.OwnerState  `json:"owners"`
}

// HostView returns the host's GPUs and ledger.
func (p *Placer) HostView() ([]wire.GPU, map[string]any) {
	devs, err := p.cfg.GPU.Devices()
	if err != nil {
		p.logger.Warn("could not read the gpus", "error", err)
	}
	gpus := make([]wire.GPU, 0, len(devs))
	for _, d := range devs {
		gpus = append(gpus, wire.GPU{Index: d.Index, UUID: d.UUID, Name: d.Name, TotalBytes: d.TotalBytes, UsedBytes: d.UsedBytes, Unified: d.Unified})
	}
	p.mu.Lock()
	if err == nil {
		p.refreshExternal(devs)
	}
	snap := p.l.Snapshot()
	p.mu.Unlock()
	return gpus, toMap(LedgerView{Epoch: snap.Epoch, GPU: p.cfg.GPU.Kind(), Domains: snap.Domains, Owners: snap.Owners})
}

// Provider returns the GPU provider the placer reads.
func (p *Placer) Provider() gpu.Provider { return p.cfg.GPU }

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
