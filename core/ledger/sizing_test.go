// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package ledger

import (
	"testing"

	"github.com/capyctl/capyctl/core/structs"
)

func TestSize(t *testing.T) {
	const mib = int64(1) << 20
	card := 24*gib - 24*gib*8/100 // a 24 GiB card's managed limit
	cases := []struct {
		name string
		in   SizingInput
		want Sizing
	}{
		{
			name: "short resources are declared in every phase, restart only parks nothing",
			in:   SizingInput{Residency: structs.ResidencyRestartOnly, Declared: &Declared{GPU: 11 * gib, RAM: 2 * gib}, DeviceLimit: card},
			want: Sizing{
				Startup: Need{11 * gib, 2 * gib}, Ready: Need{11 * gib, 2 * gib},
				StartupDeviceProvenance: ProvDeclared, StartupHostProvenance: ProvDeclared, ReadyProvenance: ProvDeclared,
			},
		},
		{
			name: "short resources parked deep keep the residue placeholder",
			in:   SizingInput{Residency: structs.ResidencyDeep, Declared: &Declared{GPU: 11 * gib, RAM: 2 * gib}, DeviceLimit: card},
			want: Sizing{
				Startup: Need{11 * gib, 2 * gib}, Ready: Need{11 * gib, 2 * gib}, Parked: Need{1 * gib, 2 * gib},
				// The weights unknown, the host copy is the ready card charge.
				ParkedHost:              Need{1 * gib, 13 * gib},
				StartupDeviceProvenance: ProvDeclared, StartupHostProvenance: ProvDeclared, ReadyProvenance: ProvDeclared, ParkedProvenance: ProvPlaceholder,
			},
		},
		{
			name: "a declared ready phase gets a startup placeholder a measurement replaces",
			in:   SizingInput{Residency: structs.ResidencyRestartOnly, Declared: &Declared{Phases: map[string]Need{PhaseReady: {4 * gib, 128 * mib}}}, Hints: Hints{StartupDeviceBytes: 4 * gib}},
			want: Sizing{
				Startup: Need{4 * gib, 128 * mib}, Ready: Need{4 * gib, 128 * mib},
				StartupDeviceProvenance: ProvPlaceholder, StartupHostProvenance: ProvPlaceholder, ReadyProvenance: ProvDeclared,
			},
		},
		{
			name: "measured startup, card and host apart",
			in: SizingInput{Residency: structs.ResidencyRestartOnly, Declared: &Declared{Phases: map[string]Need{PhaseReady: {4 * gib, 128 * mib}}},
				Measured: &Measured{DeviceBytes: 6 * gib, HostBytes: 300 * mib}},
			want: Sizing{
				Startup: Need{6 * gib, 300 * mib}, Ready: Need{4 * gib, 128 * mib},
				StartupDeviceProvenance: ProvMeasured, StartupHostProvenance: ProvMeasured, ReadyProvenance: ProvDeclared,
			},
		},
		{
			name: "a measurement below the ready charge keeps the ready charge",
			in: SizingInput{Residency: structs.ResidencyRestartOnly, Declared: &Declared{Phases: map[string]Need{PhaseReady: {4 * gib, 128 * mib}}},
				Measured: &Measured{DeviceBytes: 3 * gib}},
			want: Sizing{
				Startup: Need{4 * gib, 128 * mib}, Ready: Need{4 * gib, 128 * mib},
				StartupDeviceProvenance: ProvMeasured, StartupHostProvenance: ProvPlaceholder, ReadyProvenance: ProvDeclared,
			},
		},
		{
			name: "a declared startup is never replaced by a measurement",
			in: SizingInput{Residency: structs.ResidencyRestartOnly, Declared: &Declared{Phases: map[string]Need{PhaseStartup: {8 * gib, gib}, PhaseReady: {4 * gib, gib}}},
				Measured: &Measured{DeviceBytes: 6 * gib, HostBytes: 300 * mib}},
			want: Sizing{
				Startup: Need{8 * gib, gib}, Ready: Need{4 * gib, gib},
				StartupDeviceProvenance: ProvDeclared, StartupHostProvenance: ProvDeclared, ReadyProvenance: ProvDeclared,
			},
		},
		{
			name: "derived on a discrete card from weights",
			// W = 8 GiB: request = 8.8 + 4 = 12.8 GiB; ready 14.05 GiB; startup
			// max(14.05, 18 + 8) = 26 GiB > 22.08: the whole limit.
			in: SizingInput{Residency: structs.ResidencyDeep, Hints: Hints{WeightsBytes: 8 * gib}, DeviceLimit: card, HostLimit: 32 * gib},
			want: Sizing{
				Startup: Need{card, HostOverhead}, Ready: Need{8*gib*110/100 + 4*gib + GraphsAllowance, HostOverhead}, Parked: Need{gib, HostOverhead},
				ParkedHost:              Need{gib, HostOverhead + 12*gib},
				StartupDeviceProvenance: ProvWholeHost, StartupHostProvenance: ProvPlaceholder, ReadyProvenance: ProvDerived, ParkedProvenance: ProvPlaceholder,
				Weights: 8 * gib, KVCache: 4 * gib,
			},
		},
		{
			name: "derived startup placeholder on a large card",
			in:   SizingInput{Residency: structs.ResidencyDeep, Hints: Hints{WeightsBytes: 8 * gib}, DeviceLimit: 80 * gib},
			want: Sizing{
				Startup: Need{8*gib*225/100 + MinMargin, HostOverhead}, Ready: Need{8*gib*110/100 + 4*gib + GraphsAllowance, HostOverhead}, Parked: Need{gib, HostOverhead},
				ParkedHost:              Need{gib, HostOverhead + 12*gib},
				StartupDeviceProvenance: ProvPlaceholder, StartupHostProvenance: ProvPlaceholder, ReadyProvenance: ProvDerived, ParkedProvenance: ProvPlaceholder,
				Weights: 8 * gib, KVCache: 4 * gib,
			},
		},
		{
			name: "derived on a unified pool: weights + kv + margin",
			in:   SizingInput{Unified: true, Residency: structs.ResidencyDeep, Hints: Hints{WeightsBytes: 40 * gib}, DeviceLimit: 120 * gib},
			want: Sizing{
				Startup: Need{40*gib*225/100 + 40*gib*15/100 + 4*gib, 0}, Ready: Need{40*gib + 4*gib + 40*gib*15/100 + 4*gib, 0}, Parked: Need{2 * gib, 0},
				StartupDeviceProvenance: ProvPlaceholder, StartupHostProvenance: ProvPlaceholder, ReadyProvenance: ProvDerived, ParkedProvenance: ProvPlaceholder,
				Weights: 40 * gib, KVCache: 4 * gib,
			},
		},
		{
			name: "small card: default kv is a quarter of the limit",
			in:   SizingInput{Residency: structs.ResidencyRestartOnly, Hints: Hints{WeightsBytes: 2 * gib}, DeviceLimit: 8 * gib},
			want: Sizing{
				Startup: Need{8 * gib, HostOverhead}, Ready: Need{2*gib*110/100 + 2*gib + GraphsAllowance, HostOverhead},
				StartupDeviceProvenance: ProvWholeHost, StartupHostProvenance: ProvPlaceholder, ReadyProvenance: ProvDerived,
				Weights: 2 * gib, KVCache: 2 * gib,
			},
		},
		{
			name: "memory.request on a card derives the kv cache",
			in:   SizingInput{Residency: structs.ResidencyRestartOnly, Memory: MemorySpec{Request: 12 * gib}, Hints: Hints{WeightsBytes: 8 * gib}, DeviceLimit: 80 * gib},
			want: Sizing{
				Startup: Need{8*gib*225/100 + MinMargin, HostOverhead}, Ready: Need{12*gib + GraphsAllowance, HostOverhead},
				StartupDeviceProvenance: ProvPlaceholder, StartupHostProvenance: ProvPlaceholder, ReadyProvenance: ProvDeclared,
				Weights: 8 * gib, KVCache: 12*gib - 8*gib*110/100,
			},
		},
		{
			name: "driver estimate",
			in:   SizingInput{Residency: structs.ResidencyRestartOnly, Hints: Hints{ReadyDeviceBytes: 5 * gib, ReadyHostBytes: gib, StartupDeviceBytes: 7 * gib}, DeviceLimit: card},
			want: Sizing{
				Startup: Need{7 * gib, gib}, Ready: Need{5 * gib, gib},
				StartupDeviceProvenance: ProvPlaceholder, StartupHostProvenance: ProvPlaceholder, ReadyProvenance: ProvDerived,
			},
		},
		{
			name: "a driver estimate with nothing on the card runs off it: host RAM only",
			// llama.cpp with n_gpu_layers = 0: weights and KV in host RAM.
			in: SizingInput{Residency: structs.ResidencyRestartOnly, Hints: Hints{WeightsBytes: 4 * gib, KVCacheBytes: gib, ReadyHostBytes: 5 * gib}, DeviceLimit: card},
			want: Sizing{
				Startup: Need{0, 5 * gib}, Ready: Need{0, 5 * gib},
				StartupDeviceProvenance: ProvPlaceholder, StartupHostProvenance: ProvPlaceholder, ReadyProvenance: ProvDerived,
				Weights: 4 * gib, KVCache: gib, HostOnly: true,
			},
		},
		{
			name: "a measured card peak puts an off-card estimate back on a card",
			in: SizingInput{Residency: structs.ResidencyRestartOnly, Hints: Hints{WeightsBytes: 4 * gib, KVCacheBytes: gib, ReadyHostBytes: 5 * gib},
				Measured: &Measured{DeviceBytes: 300 * mib}, DeviceLimit: card},
			want: Sizing{
				Startup: Need{300 * mib, 5 * gib}, Ready: Need{0, 5 * gib},
				StartupDeviceProvenance: ProvMeasured, StartupHostProvenance: ProvPlaceholder, ReadyProvenance: ProvDerived,
				Weights: 4 * gib, KVCache: gib,
			},
		},
		{
			name: "a partial offload charges each side the driver's share",
			in: SizingInput{Residency: structs.ResidencyRestartOnly, Hints: Hints{WeightsBytes: 4 * gib, KVCacheBytes: gib,
				ReadyDeviceBytes: 2*gib + gib/2, ReadyHostBytes: 2*gib + gib/2 + 256*mib, StartupDeviceBytes: 2*gib + gib/2}, DeviceLimit: card},
			want: Sizing{
				Startup: Need{2*gib + gib/2, 2*gib + gib/2 + 256*mib}, Ready: Need{2*gib + gib/2, 2*gib + gib/2 + 256*mib},
				StartupDeviceProvenance: ProvPlaceholder, StartupHostProvenance: ProvPlaceholder, ReadyProvenance: ProvDerived,
				Weights: 4 * gib, KVCache: gib,
			},
		},
		{
			name: "nothing known charges nothing until measured",
			in:   SizingInput{Residency: structs.ResidencyRestartOnly},
			want: Sizing{StartupDeviceProvenance: ProvPlaceholder, StartupHostProvenance: ProvPlaceholder, ReadyProvenance: ProvPlaceholder},
		},
		{
			name: "a measured residue, never below the placeholder nor above ready",
			in: SizingInput{Residency: structs.ResidencyDeep, Declared: &Declared{GPU: 11 * gib, RAM: 2 * gib},
				MeasuredParked: &Measured{DeviceBytes: 3 * gib}},
			want: Sizing{
				Startup: Need{11 * gib, 2 * gib}, Ready: Need{11 * gib, 2 * gib}, Parked: Need{3 * gib, 2 * gib},
				ParkedHost:              Need{3 * gib, 13 * gib},
				StartupDeviceProvenance: ProvDeclared, StartupHostProvenance: ProvDeclared, ReadyProvenance: ProvDeclared, ParkedProvenance: ProvMeasured,
			},
		},
		{
			name: "parked_host charges a host copy of the weights (weights x 1.5), parked drops them",
			in:   SizingInput{Residency: structs.ResidencyHostBacked, Hints: Hints{WeightsBytes: 8 * gib}, DeviceLimit: 80 * gib},
			want: Sizing{
				Startup: Need{8*gib*225/100 + MinMargin, HostOverhead}, Ready: Need{8*gib*110/100 + 4*gib + GraphsAllowance, HostOverhead}, Parked: Need{gib, HostOverhead},
				ParkedHost:              Need{gib, HostOverhead + 12*gib},
				StartupDeviceProvenance: ProvPlaceholder, StartupHostProvenance: ProvPlaceholder, ReadyProvenance: ProvDerived, ParkedProvenance: ProvPlaceholder,
				Weights: 8 * gib, KVCache: 4 * gib,
			},
		},
		{
			name: "a private LMCache is charged to host RAM beside declared resources, restart only, and stays charged parked",
			in: SizingInput{Residency: structs.ResidencyRestartOnly, Declared: &Declared{GPU: 11 * gib, RAM: 2 * gib},
				Hints: Hints{BesideHostBytes: 5 * gib}, DeviceLimit: card},
			want: Sizing{
				Startup: Need{11 * gib, 7 * gib}, Ready: Need{11 * gib, 7 * gib}, Parked: Need{0, 5 * gib}, BesideHost: 5 * gib,
				StartupDeviceProvenance: ProvDeclared, StartupHostProvenance: ProvDeclared, ReadyProvenance: ProvDeclared, ParkedProvenance: ProvDerived,
			},
		},
		{
			name: "a private LMCache beside a derived engine, and in the unified pool",
			in:   SizingInput{Unified: true, Residency: structs.ResidencyRestartOnly, Declared: &Declared{GPU: 11 * gib}, Hints: Hints{BesideHostBytes: 5 * gib}},
			want: Sizing{
				Startup: Need{11 * gib, 5 * gib}, Ready: Need{11 * gib, 5 * gib}, Parked: Need{0, 5 * gib}, BesideHost: 5 * gib,
				StartupDeviceProvenance: ProvDeclared, StartupHostProvenance: ProvDeclared, ReadyProvenance: ProvDeclared, ParkedProvenance: ProvDerived,
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := Size(c.in)
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Fatalf("Size() =\n  %+v\nwant\n  %+v", got, c.want)
			}
		})
	}
}

func TestSize_RequestTooSmall(t *testing.T) {
	_, err := Size(SizingInput{Memory: MemorySpec{Request: 8 * gib}, Hints: Hints{WeightsBytes: 8 * gib}})
	if !structs.HasCode(err, structs.CodeCheckpointUnusable) {
		t.Fatalf("err = %v, want checkpoint_unusable", err)
	}
}

func TestParkedResidue(t *testing.T) {
	cases := []struct {
		name     string
		measured int64
		unified  bool
		ready    int64
		want     int64
	}{
		{name: "measured", measured: 3 * gib, ready: 10 * gib, want: 3 * gib},
		{name: "below the card placeholder", measured: gib / 4, ready: 10 * gib, want: gib},
		{name: "below the unified placeholder", measured: gib, unified: true, ready: 10 * gib, want: 2 * gib},
		{name: "above ready", measured: 12 * gib, ready: 10 * gib, want: 10 * gib},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := ParkedResidue(c.measured, c.unified, c.ready); got != c.want {
				t.Fatalf("ParkedResidue = %d, want %d", got, c.want)
			}
		})
	}
}
