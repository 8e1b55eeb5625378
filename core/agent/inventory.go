// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"github.com/capyctl/capyctl/core/api/dashboard"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/gpu"
	"github.com/capyctl/capyctl/core/structs"
)

// gpuInventory is the wire form of what the GPU provider found at start;
// nil on a role that runs no engines (a server).
func (a *Agent) gpuInventory() *wire.GPUInventory {
	if a.GPU == nil {
		return nil
	}
	inv := a.inventory
	out := &wire.GPUInventory{Provider: inv.Kind, Driver: inv.Driver, NoGPU: inv.NoGPU, Devices: []wire.GPU{}}
	for _, d := range inv.Devices {
		out.Devices = append(out.Devices, wire.GPU{Index: d.Index, UUID: d.UUID, Name: d.Name, TotalBytes: d.TotalBytes, UsedBytes: d.UsedBytes, Unified: d.Unified})
	}
	return out
}

// logInventory logs every GPU found, or "no GPU found" with the reason:
// under gpu.provider = auto a machine whose driver is broken reads as
// one without a GPU, and the log says so at start rather than a deploy
// failing later.
func (a *Agent) logInventory(provider string) {
	inv := a.inventory
	if len(inv.Devices) == 0 {
		if provider == gpu.KindNone {
			a.logger.Info("no GPU found", "reason", inv.NoGPU, "gpu_provider", provider)
			return
		}
		a.logger.Warn("no GPU found", "reason", inv.NoGPU, "gpu_provider", provider)
		return
	}
	for _, d := range inv.Devices {
		a.logger.Info("gpu found", "index", d.Index, "name", d.Name, "total_bytes", d.TotalBytes, "unified", d.Unified,
			"uuid", d.UUID, "driver", inv.Driver, "gpu_provider", inv.Kind)
	}
}

// GPULines describe what the GPU provider found, for a banner: one line
// per GPU, or "no GPU found (<why>)"; none on a server.
func (r Running) GPULines() []string {
	if inv := r.a.gpuInventory(); inv != nil {
		return inv.Lines()
	}
	return nil
}

// playgroundKeys are the inference keys the dashboard's playground may use
// by name: the role's own key, the key named default, while it is not
// revoked. Named keys are not offered: the role keeps only their digests
// (paste one into the page to try it).
func (a *Agent) playgroundKeys() []dashboard.Key {
	if a.Keys != nil {
		if v, err := a.Keys.Get(structs.DefaultKeyName); err != nil || !v.Key.Role {
			return []dashboard.Key{}
		}
	}
	return []dashboard.Key{{Name: structs.DefaultKeyName, Description: "the role's API key, the api_key line of its credentials file", Secret: a.Creds.APIKey}}
}
