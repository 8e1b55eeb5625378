// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package ledger

import (
	"github.com/capyctl/capyctl/core/structs"
)

// Provenances of a charge: where its figure came from.
const (
	// ProvPlaceholder is an estimate made before anything was measured.
	ProvPlaceholder = "placeholder"
	// ProvDerived is computed from the checkpoint (weights, KV cache) or
	// the driver's own estimate.
	ProvDerived = "derived"
	// ProvDeclared is the operator's figure (resources, memory.request,
	// memory.startup).
	ProvDeclared = "declared"
	// ProvMeasured is the peak measured from the engine's own processes on
	// an earlier start.
	ProvMeasured = "measured"
	// ProvWholeHost is a first start whose estimate exceeds the managed
	// limit: it sets aside the whole limit, so it starts alone.
	ProvWholeHost = "whole_host"
)

// Sizing constants (reference/original.md §4).
const (
	// GraphsAllowance is the CUDA context and graphs of one captured model.
	GraphsAllowance = 5 * structs.GiB / 4
	// HostOverhead is an engine's host RAM on a discrete machine when
	// nothing better is known.
	HostOverhead = 4 * structs.GiB
	// MinMargin is the unified request's margin; weights×0.15 + 4 GiB
	// when larger.
	MinMargin = 8 * structs.GiB
	// MaxDefaultKV caps the default KV cache (min(4 GiB, managed/4)).
	MaxDefaultKV = 4 * structs.GiB
	// ParkedDevicePlaceholder is a parked engine's residue on a card until
	// measured; ParkedUnifiedPlaceholder on a unified pool.
	ParkedDevicePlaceholder  = 1 * structs.GiB
	ParkedUnifiedPlaceholder = 2 * structs.GiB
)

// Need is a charge on the card (or the pool) and in host RAM.
type Need struct {
	Device int64 `json:"device_bytes"`
	Host   int64 `json:"host_bytes"`
}

// Total is Device + Host (a unified pool is charged the sum).
func (n Need) Total() int64 { return n.Device + n.Host }

// Declared is a deployment's resources block: the short form (GPU and RAM
// charged in every phase but stopped) or per-phase charges.
type Declared struct {
	GPU    int64
	RAM    int64
	Phases map[string]Need
}

// MemorySpec is engine_config.memory (0 = not set).
type MemorySpec struct {
	Request int64
	KVCache int64
	Startup int64
}

// Hints are the driver's memory hints (sdk.MemoryHints).
type Hints struct {
	WeightsBytes       int64
	KVCacheBytes       int64
	ReadyDeviceBytes   int64
	ReadyHostBytes     int64
	StartupDeviceBytes int64
	// BesideHostBytes is host RAM a launch holds beside its engine (a
	// private LMCache's pool and server): added to the host side of every
	// phase the launch's processes run in.
	BesideHostBytes int64
}

// Measured is a startup peak measured on an earlier start (0 = not
// measured on that side).
type Measured struct {
	DeviceBytes int64
	HostBytes   int64
}

// SizingInput is everything Size needs.
type SizingInput struct {
	// Unified is a machine with one pool; else discrete cards and host RAM.
	Unified bool
	// Residency is the effective residency (deep, host_backed,
	// restart_only).
	Residency string
	Declared  *Declared
	Memory    MemorySpec
	Hints     Hints
	// DeviceLimit is the managed limit of the card (or pool) the instance
	// would use, for the default KV cache and the whole-host first start;
	// 0 when there is none.
	DeviceLimit int64
	// HostLimit is the system domain's managed limit (discrete machines).
	HostLimit int64
	Measured  *Measured
	// MeasuredParked is the residue measured after an earlier park (only
	// its card side is used).
	MeasuredParked *Measured
}

// Sizing is what a deployment is charged in each phase, and where each
// figure came from.
type Sizing struct {
	Startup Need `json:"startup"`
	Ready   Need `json:"ready"`
	// Parked is the charge of a park that drops the weights (deep,
	// vLLM's level 2); ParkedHost of one that keeps them in host RAM
	// (host_backed, level 1): Parked plus the host copy, zero where a park
	// cannot keep them (a unified pool, restart only).
	Parked     Need `json:"parked"`
	ParkedHost Need `json:"parked_host"`
	// StartupDeviceProvenance and StartupHostProvenance say where the
	// startup figures came from (status startup.device_provenance,
	// startup.host_provenance).
	StartupDeviceProvenance string `json:"startup_device_provenance"`
	StartupHostProvenance   string `json:"startup_host_provenance"`
	ReadyProvenance         string `json:"ready_provenance"`
	ParkedProvenance        string `json:"parked_provenance,omitempty"`
	// Weights and KVCache are the figures a derived request used.
	Weights int64 `json:"weights_bytes,omitempty"`
	KVCache int64 `json:"kv_cache_bytes,omitempty"`
	// BesideHost is the host RAM held beside the engine (a private
	// LMCache), included in the host figures above.
	BesideHost int64 `json:"beside_host_bytes,omitempty"`
	// HostOnly is a model the driver runs without a card (a llama.cpp
	// model with n_gpu_layers = 0): nothing on a card in any phase, so
	// placement pins no card and a host without a GPU can run it.
	HostOnly bool `json:"host_only,omitempty"`
}

// margin is the unified request's margin: 8 GiB, or weights×0.15 + 4 GiB
// when larger.
func margin(weights int64) int64 {
	m := weights*15/100 + 4*structs.GiB
	if m < MinMargin {
		return MinMargin
	}
	return m
}

// Size turns a deployment's declarations, the driver's hints and any
// measurement into charges per phase (reference/original.md §4):
//
//   - declared resources win: the short form is charged in startup, ready
//     and (unless restart only) parked; per-phase blocks charge what they
//     say, a missing startup is estimated from ready;
//   - otherwise the ready charge is derived from the weights W and the KV
//     cache K: discrete W×1.10 + K plus 1.25 GiB of CUDA context and graphs
//     on the card and 4 GiB of host RAM; unified W + K + margin;
//   - the startup placeholder is max(request + graphs, W×2.25 + margin),
//     or the driver's own startup figure; a driver estimate that holds
//     nothing on the card (a CPU-only model) puts nothing there at startup;
//     a measured peak replaces it, side by side, once one exists (never
//     below the ready charge); an estimate above the managed limit sets
//     aside the whole limit instead (whole_host);
//   - parked is the residue placeholder (1 GiB on a card, 2 GiB unified);
//     parked_host (discrete cards) adds the host copy of the weights
//     (weights×1.5, or the ready card charge while the weights are
//     unknown), charged when a park keeps them in host RAM; restart only
//     parks nothing but what is held beside the engine (a private
//     LMCache's pool and server, kept across its park).
func Size(in SizingInput) (Sizing, error) {
	var s Sizing
	h := in.Hints
	w := h.WeightsBytes
	s.Weights = w
	kv := in.Memory.KVCache
	if kv == 0 {
		kv = h.KVCacheBytes
	}
	if kv == 0 && w > 0 {
		kv = MaxDefaultKV
		if in.DeviceLimit > 0 && in.DeviceLimit/4 < kv {
			kv = in.DeviceLimit / 4
		}
	}

	// Ready.
	var request int64 // the engine's own memory before graphs
	// offCard is a driver's own estimate that holds nothing on a card (a
	// llama.cpp model with n_gpu_layers = 0): it starts off the card too,
	// so no startup placeholder is put there.
	offCard := false
	decl := in.Declared
	var declReady, declStartup, declParked *Need
	if decl != nil {
		if decl.GPU > 0 || decl.RAM > 0 {
			n := Need{Device: decl.GPU, Host: decl.RAM}
			declReady, declStartup = &n, &n
		}
		if p, ok := decl.Phases[PhaseReady]; ok {
			declReady = &p
		}
		if p, ok := decl.Phases[PhaseStartup]; ok {
			declStartup = &p
			if declReady == nil {
				declReady = &p
			}
		}
		if p, ok := decl.Phases[PhaseParked]; ok {
			declParked = &p
		}
	}
	switch {
	case declReady != nil:
		s.Ready = *declReady
		s.ReadyProvenance = ProvDeclared
		request = s.Ready.Device
	case in.Memory.Request > 0:
		request = in.Memory.Request
		s.ReadyProvenance = ProvDeclared
		if in.Memory.KVCache == 0 && w > 0 {
			if in.Unified {
				kv = request - w - margin(w)
			} else {
				kv = request - w*110/100
			}
			if kv <= 0 {
				return Sizing{}, structs.Errf(structs.CodeCheckpointUnusable,
					"engine_config.memory.request %s leaves no room for a KV cache beside %s of weights",
					formatBytes(request), formatBytes(w))
			}
		}
		if in.Unified {
			s.Ready = Need{Device: request}
		} else {
			s.Ready = Need{Device: request + GraphsAllowance, Host: orDefault(h.ReadyHostBytes, HostOverhead)}
		}
	case h.ReadyDeviceBytes > 0 || h.ReadyHostBytes > 0:
		s.Ready = Need{Device: h.ReadyDeviceBytes, Host: h.ReadyHostBytes}
		s.ReadyProvenance = ProvDerived
		request = h.ReadyDeviceBytes
		offCard = h.ReadyDeviceBytes == 0 && h.StartupDeviceBytes == 0
	case w > 0:
		s.ReadyProvenance = ProvDerived
		if in.Unified {
			request = w + kv + margin(w)
			s.Ready = Need{Device: request}
		} else {
			request = w*110/100 + kv
			s.Ready = Need{Device: request + GraphsAllowance, Host: HostOverhead}
		}
	default:
		// Nothing declared, nothing known (a custom engine without
		// resources): nothing is charged until a start measures it.
		s.ReadyProvenance = ProvPlaceholder
	}
	s.KVCache = kv
	if b := h.BesideHostBytes; b > 0 {
		// IMPORTANT: charged on top of whatever sized the engine, declared
		// resources included: the operator declares the engine, the
		// lmcache_pool the cache.
		s.Ready.Host += b
		s.BesideHost = b
	}

	// Startup.
	s.StartupDeviceProvenance, s.StartupHostProvenance = ProvPlaceholder, ProvPlaceholder
	switch {
	case declStartup != nil:
		s.Startup = *declStartup
		s.StartupDeviceProvenance, s.StartupHostProvenance = ProvDeclared, ProvDeclared
	default:
		s.Startup = s.Ready
		switch {
		case in.Memory.Startup > 0:
			s.Startup.Device = in.Memory.Startup
			s.StartupDeviceProvenance = ProvDeclared
		case h.StartupDeviceBytes > 0 && declReady == nil:
			s.Startup.Device = h.StartupDeviceBytes
		case offCard:
			s.Startup.Device = 0
		case w > 0:
			peak := request + GraphsAllowance
			if alt := w*225/100 + margin(w); alt > peak {
				peak = alt
			}
			s.Startup.Device = peak
		}
		if m := in.Measured; m != nil {
			if m.DeviceBytes > 0 && s.StartupDeviceProvenance != ProvDeclared {
				s.Startup.Device = m.DeviceBytes
				s.StartupDeviceProvenance = ProvMeasured
			}
			if m.HostBytes > 0 {
				s.Startup.Host = m.HostBytes
				s.StartupHostProvenance = ProvMeasured
			}
		}
	}
	// A start peaks at least as high as the model serves.
	s.Startup.Device = max(s.Startup.Device, s.Ready.Device)
	s.Startup.Host = max(s.Startup.Host, s.Ready.Host)
	// An estimate above the whole limit, for a model that fits once ready,
	// sets aside the whole limit: it starts alone.
	if s.StartupDeviceProvenance == ProvPlaceholder && in.DeviceLimit > 0 &&
		s.Startup.Device > in.DeviceLimit && s.Ready.Device <= in.DeviceLimit {
		s.Startup.Device = in.DeviceLimit
		s.StartupDeviceProvenance = ProvWholeHost
	}
	if s.StartupHostProvenance == ProvPlaceholder && in.HostLimit > 0 && !in.Unified &&
		s.Startup.Host > in.HostLimit && s.Ready.Host <= in.HostLimit {
		s.Startup.Host = in.HostLimit
		s.StartupHostProvenance = ProvWholeHost
	}

	// Parked.
	switch {
	case in.Residency == structs.ResidencyRestartOnly:
		// IMPORTANT: a restart_only instance parks by stopping its
		// engine; only what is held beside it stays: its LMCache server
		// and pool, kept for its next launch.
		s.Parked = Need{Host: s.BesideHost}
		s.ParkedProvenance = ""
		if s.BesideHost > 0 {
			s.ParkedProvenance = ProvDerived
		}
	case declParked != nil:
		s.Parked = *declParked
		s.ParkedProvenance = ProvDeclared
	default:
		residue := ParkedDevicePlaceholder
		if in.Unified {
			residue = ParkedUnifiedPlaceholder
		}
		s.Parked = Need{Device: min(residue, s.Ready.Device), Host: s.Ready.Host}
		s.ParkedProvenance = ProvPlaceholder
		if m := in.MeasuredParked; m != nil && m.DeviceBytes > 0 {
			s.Parked.Device = ParkedResidue(m.DeviceBytes, in.Unified, s.Ready.Device)
			s.ParkedProvenance = ProvMeasured
		}
	}
	s.Parked.Device = min(s.Parked.Device, s.Ready.Device)
	if in.Residency != structs.ResidencyRestartOnly && !in.Unified {
		copyBytes := w * 3 / 2
		if copyBytes == 0 {
			copyBytes = s.Ready.Device
		}
		s.ParkedHost = Need{Device: s.Parked.Device, Host: s.Parked.Host + copyBytes}
	}
	s.HostOnly = offCard && s.Startup.Device == 0 && s.Ready.Device == 0 && s.Parked.Device == 0
	return s, nil
}

func orDefault(v, def int64) int64 {
	if v > 0 {
		return v
	}
	return def
}

// ParkedResidue is the card charge of a parked engine from a measured
// residue: never below the placeholder (1 GiB on a card, 2 GiB unified) and
// never above the ready charge.
func ParkedResidue(measured int64, unified bool, ready int64) int64 {
	floor := ParkedDevicePlaceholder
	if unified {
		floor = ParkedUnifiedPlaceholder
	}
	return min(max(measured, floor), ready)
}
