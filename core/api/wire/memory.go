// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package wire

import "time"

// MemoryView is a deployment's memory in `status deployment`: the shape of
// DeploymentStatus.Memory (its "memory" object).
type MemoryView struct {
	Host string `json:"host"`
	// Domain is where the last start was placed ("gpu0", "unified", or
	// "system" on a host without GPUs).
	Domain  string      `json:"domain,omitempty"`
	Startup StartupView `json:"startup"`
	Ready   PhaseView   `json:"ready"`
	Parked  PhaseView   `json:"parked"`
	// ParkedHost is the charge of a park that keeps the weights in host
	// RAM (host_backed, vLLM's sleep level 1), taken when the host has
	// room for it; nil where a park cannot keep them.
	ParkedHost *PhaseView   `json:"parked_host,omitempty"`
	KVCache    int64        `json:"kv_cache_bytes,omitempty"`
	Weights    int64        `json:"weights_bytes,omitempty"`
	Measured   *Measurement `json:"measured,omitempty"`
	// Ledger is the host's ledger: every domain's capacity, limit,
	// reserve, charges and what is free.
	Ledger []LedgerDomain `json:"ledger"`
}

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

// Measurement is a stored startup peak.
type Measurement struct {
	DeviceBytes int64 `json:"device_bytes"`
	HostBytes   int64 `json:"host_bytes"`
	// Provenance is "measured", "declared", "derived" or "placeholder".
	Provenance string    `json:"provenance"`
	At         time.Time `json:"at"`
	// Samples counts the readings merged into this one.
	Samples int `json:"samples"`
}

// LedgerDomain is one memory domain of the host's ledger and what is
// charged in it.
type LedgerDomain struct {
	// Name is "unified", "system" or "gpu<index>".
	Name string `json:"name"`
	// Kind is "unified", "system" or "device".
	Kind string `json:"kind"`
	// DeviceUUID names the card of a device domain (and of a unified pool,
	// when the GPU reports one).
	DeviceUUID string `json:"device_uuid,omitempty"`
	// DeviceName is the card's product name, for people.
	DeviceName string `json:"device_name,omitempty"`
	// Capacity is the domain's whole memory.
	Capacity int64 `json:"capacity_bytes"`
	// ManagedLimit is the most CapyCTL may charge in the domain.
	ManagedLimit int64 `json:"managed_limit_bytes"`
	// FreeReserve is what always stays free of CapyCTL's charges.
	FreeReserve int64 `json:"free_reserve_bytes"`
	// External is what the domain holds outside CapyCTL, as last observed.
	External int64 `json:"external_bytes"`
	// Room is min(managed limit, capacity − max(reserve, external)).
	Room int64 `json:"room_bytes"`
	// Charged is the sum of every owner's charge.
	Charged int64 `json:"charged_bytes"`
	// Free is Room − Charged (0 when over).
	Free int64 `json:"free_bytes"`
}

// LedgerOwner is one instance's charges in the ledger.
type LedgerOwner struct {
	ID    string `json:"id"`
	Phase string `json:"phase"`
	// Charges is what the owner holds now, by domain.
	Charges map[string]int64 `json:"charges"`
	// Plan is the owner's charge in each phase, by domain.
	Plan map[string]map[string]int64 `json:"plan"`
}

// LedgerView is the host's ledger: the shape of Host.Ledger (GET
// /management/v1/hosts and each host's ledger).
type LedgerView struct {
	Epoch   uint64         `json:"epoch"`
	GPU     string         `json:"gpu_provider"`
	Domains []LedgerDomain `json:"domains"`
	Owners  []LedgerOwner  `json:"owners"`
}

// LoadResponse answers GET /management/v1/metrics/load.
type LoadResponse struct {
	APIVersion  string           `json:"api_version"`
	At          time.Time        `json:"at"`
	Deployments []DeploymentLoad `json:"deployments"`
}

// DeploymentLoad is one deployment's load: the router's request counts and
// each ready engine's idle signal and figures.
type DeploymentLoad struct {
	Deployment string        `json:"deployment"`
	Requests   RequestCounts `json:"requests"`
	// Engines maps an instance to its engine's idle signal and figures.
	Engines map[string]EngineLoad `json:"engines,omitempty"`
}

// RequestCounts are a deployment's requests as admission counts them.
type RequestCounts struct {
	// Places is the running places per instance.
	Places int `json:"places"`
	// MaxWaiting bounds the line.
	MaxWaiting int `json:"max_waiting"`
	// Waiting requests are in the line.
	Waiting int `json:"waiting"`
	// InFlight requests hold a place and are being served.
	InFlight int `json:"in_flight"`
	// SettleWhenIdle, SettleAtStop and SettleOnAbort count cut requests
	// still holding a place, by the evidence they wait for.
	SettleWhenIdle int `json:"settle_when_idle"`
	SettleAtStop   int `json:"settle_at_stop"`
	SettleOnAbort  int `json:"settle_on_abort"`
	// Instances are the figures per instance.
	Instances []InstanceRequestCounts `json:"instances,omitempty"`
	// Turn is "open", "ending" (another model waits for its memory: it
	// serves what waits for it, then closes) or "ended" (it admits nothing
	// until it is back in memory).
	Turn string `json:"turn,omitempty"`
}

// InstanceRequestCounts are one instance's requests.
type InstanceRequestCounts struct {
	ID             string `json:"id"`
	Generation     uint64 `json:"generation"`
	Ready          bool   `json:"ready"`
	InFlight       int    `json:"in_flight"`
	SettleWhenIdle int    `json:"settle_when_idle"`
	SettleAtStop   int    `json:"settle_at_stop"`
	SettleOnAbort  int    `json:"settle_on_abort"`
}

// EngineLoad is an engine's idle signal and load figures, read through its
// driver.
type EngineLoad struct {
	// Known is false when the engine has no idle signal or did not answer.
	Known   bool               `json:"known"`
	Running int64              `json:"running"`
	Waiting int64              `json:"waiting"`
	KVUsage float64            `json:"kv_usage"`
	Figures map[string]float64 `json:"figures,omitempty"`
	// At is when the reading was taken.
	At time.Time `json:"at"`
}
