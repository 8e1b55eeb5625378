// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package gpu is a host's memory inventory: the GPUs (devices, UUIDs,
// total/used/free memory, and what each process holds on them) behind one
// interface with two providers, NVML (github.com/NVIDIA/go-nvml) and a
// simulated GPU read from the testkit's shared state file, plus the host's
// RAM (/proc/meminfo bounded by the role's cgroup) and the host memory of
// an engine's processes. It reads; it never decides. core/placement turns
// the readings into ledger domains and measurements.
package gpu

import (
	"errors"
	"fmt"
	"strings"
)

// Provider kinds (the gpu.provider setting).
const (
	KindAuto      = "auto"
	KindNVML      = "nvml"
	KindSimulated = "simulated"
	KindNone      = "none"
)

// ErrNoGPU means the machine has no usable NVIDIA GPU (no driver, no
// libnvidia-ml, no device). It is a fact about the machine, not a failure:
// gpu.provider = auto falls back to none on it.
var ErrNoGPU = errors.New("no NVIDIA GPU")

// Device is one GPU.
type Device struct {
	// Index is the CUDA index (nvidia-smi's order).
	Index int `json:"index"`
	// UUID is NVML's "GPU-xxxxxxxx-…"; CUDA_VISIBLE_DEVICES accepts it.
	UUID string `json:"uuid"`
	// Name is the product name.
	Name string `json:"name"`
	// TotalBytes is the card's memory; 0 on a unified machine whose GPU
	// reports none (the pool is host RAM).
	TotalBytes int64 `json:"total_bytes"`
	// UsedBytes is what every process (and the driver) holds now.
	UsedBytes int64 `json:"used_bytes"`
	// FreeBytes is TotalBytes − UsedBytes as the driver reports it.
	FreeBytes int64 `json:"free_bytes"`
	// Unified marks memory shared with the host (GB10-class).
	Unified bool `json:"unified,omitempty"`
}

// ProcessMemory is what one process holds on one device.
type ProcessMemory struct {
	PID        int    `json:"pid"`
	DeviceUUID string `json:"device_uuid"`
	Bytes      int64  `json:"bytes"`
}

// Provider reads the GPUs of this machine. Implementations are safe for
// concurrent use.
type Provider interface {
	// Kind is KindNVML, KindSimulated or KindNone.
	Kind() string
	// Devices lists the GPUs with their memory now, by index.
	Devices() ([]Device, error)
	// Processes lists what each live process holds on each device now.
	Processes() ([]ProcessMemory, error)
	// Close releases the provider (NVML's shutdown).
	Close() error
}

// Options choose and shape a provider (the role's gpu.* settings).
type Options struct {
	// Provider is KindAuto (NVML when a GPU answers, else none), KindNVML
	// (a GPU is required), KindSimulated or KindNone.
	Provider string
	// SimState is the simulated GPU's state file (required for
	// KindSimulated; created with the Sim* shape when missing).
	SimState string
	// SimDevices, SimDeviceMemory and SimUnified shape a new state file.
	SimDevices      int
	SimDeviceMemory int64
	SimUnified      bool
}

// Open returns the provider the options name. KindAuto answers the none
// provider when NVML reports no GPU; KindNVML answers an error wrapping
// ErrNoGPU instead. Nothing here panics on a machine without a GPU.
func Open(o Options) (Provider, error) {
	switch o.Provider {
	case "", KindAuto:
		p, err := openNVML()
		if errors.Is(err, ErrNoGPU) {
			// The reason stays with the provider: the banner, the log and
			// capyctl status say "no GPU found (<reason>)".
			return None{Reason: strings.TrimPrefix(err.Error(), ErrNoGPU.Error()+": ")}, nil
		}
		return p, err
	case KindNVML:
		return openNVML()
	case KindSimulated:
		if o.SimState == "" {
			return nil, fmt.Errorf("the simulated gpu needs a state file")
		}
		if err := CreateSimState(o.SimState, SimDevices(o.SimDevices, o.SimDeviceMemory, o.SimUnified)); err != nil {
			return nil, err
		}
		return OpenSimulated(o.SimState)
	case KindNone:
		return None{Reason: "gpu.provider = none"}, nil
	}
	return nil, fmt.Errorf("unknown gpu provider %q (auto, nvml, simulated or none)", o.Provider)
}

// None is the provider of a machine without GPUs.
type None struct {
	// Reason says why there is no GPU: NVML's answer under auto ("nvml
	// init: ERROR_LIBRARY_NOT_FOUND", "this build of capyctl has no
	// NVML"), or "gpu.provider = none".
	Reason string
}

// Kind implements Provider.
func (None) Kind() string { return KindNone }

// Devices implements Provider: none.
func (None) Devices() ([]Device, error) { return nil, nil }

// Processes implements Provider: none.
func (None) Processes() ([]ProcessMemory, error) { return nil, nil }

// Close implements Provider.
func (None) Close() error { return nil }

// Inventory is what a provider found, for people (the role's banner and
// log) and for capyctl status: every GPU with its model and memory and the
// driver's version, or why there is none.
type Inventory struct {
	// Kind is the provider's (KindNVML, KindSimulated, KindNone).
	Kind string
	// Driver is the NVIDIA driver's version (NVML), "" otherwise.
	Driver string
	// Devices are the GPUs found.
	Devices []Device
	// NoGPU is why no GPU was found, when Devices is empty.
	NoGPU string
}

// Describe reads a provider's inventory now. A provider that cannot list
// its devices has none, with its error as the reason.
func Describe(p Provider) Inventory {
	if p == nil {
		return Inventory{Kind: KindNone, NoGPU: "no GPU provider"}
	}
	inv := Inventory{Kind: p.Kind()}
	if d, ok := p.(interface{ DriverVersion() string }); ok {
		inv.Driver = d.DriverVersion()
	}
	devs, err := p.Devices()
	switch {
	case err != nil:
		inv.NoGPU = "listing the GPUs failed: " + err.Error()
	case len(devs) == 0:
		inv.NoGPU = "no device listed"
		if n, ok := p.(None); ok && n.Reason != "" {
			inv.NoGPU = n.Reason
		}
	}
	inv.Devices = devs
	return inv
}
