// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package placement

import (
	"github.com/capyctl/capyctl/core/ledger"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk"
)

// Validate refuses, when a deployment is written, a charge that no domain
// of this host could ever hold: a card charge above every card's managed
// limit (or on a host without a GPU) is insufficient_device_memory, a host
// RAM charge above the system domain's is insufficient_memory. Whether it
// fits beside what runs is decided at start (capacity_blocked).
// lifecycle.ValidateDeployment calls it.
func (p *Placer) Validate(spec *structs.Deployment, eng *structs.EngineRecord, hints *sdk.MemoryHints, residency string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	in := p.sizingInput(spec, hints, residency, nil)
	doms := p.l.Domains()
	need := func(s ledger.Sizing) ledger.Need {
		return ledger.Need{
			Device: max(s.Startup.Device, s.Ready.Device, s.Parked.Device),
			Host:   max(s.Startup.Host, s.Ready.Host, s.Parked.Host),
		}
	}
	if p.unified() {
		pool := doms[0]
		in.DeviceLimit = pool.ManagedLimit
		sz, err := ledger.Size(in)
		if err != nil {
			return err
		}
		p.views[spec.Name] = &deploymentView{Sizing: sz}
		if n := need(sz); n.Total() > pool.ManagedLimit {
			return structs.Errf(structs.CodeInsufficientDevice,
				"deployment %s needs %s of the unified memory pool and host %s manages at most %s of it (memory.system.managed_limit)",
				spec.Name, structs.FormatBytes(n.Total()), p.cfg.Host, structs.FormatBytes(pool.ManagedLimit)).
				WithDetail("host", p.cfg.Host).WithDetail("domain", pool.Name).
				WithDetail("need_bytes", n.Total()).WithDetail("limit_bytes", pool.ManagedLimit)
		}
		return nil
	}
	var sys ledger.Domain
	var best *ledger.Domain
	for i := range doms {
		d := doms[i]
		switch d.Kind {
		case ledger.KindSystem:
			sys = d
		case ledger.KindDevice:
			if best == nil || d.ManagedLimit > best.ManagedLimit {
				best = &doms[i]
			}
		}
	}
	if best != nil {
		in.DeviceLimit = best.ManagedLimit
	}
	sz, err := ledger.Size(in)
	if err != nil {
		return err
	}
	p.views[spec.Name] = &deploymentView{Sizing: sz}
	n := need(sz)
	switch {
	case n.Device > 0 && best == nil:
		return structs.Errf(structs.CodeInsufficientDevice,
			"deployment %s needs %s of GPU memory and host %s has no GPU%s", spec.Name, structs.FormatBytes(n.Device), p.cfg.Host, cpuHint(eng)).
			WithDetail("host", p.cfg.Host).WithDetail("need_bytes", n.Device)
	case best != nil && n.Device > best.ManagedLimit:
		return structs.Errf(structs.CodeInsufficientDevice,
			"deployment %s needs %s of GPU memory and the largest card of host %s (%s, %s) manages at most %s",
			spec.Name, structs.FormatBytes(n.Device), p.cfg.Host, best.Name, structs.FormatBytes(best.Capacity),
			structs.FormatBytes(best.ManagedLimit)).
			WithDetail("host", p.cfg.Host).WithDetail("domain", best.Name).
			WithDetail("need_bytes", n.Device).WithDetail("limit_bytes", best.ManagedLimit)
	case n.Host > sys.ManagedLimit:
		return structs.Errf(structs.CodeInsufficientMemory,
			"deployment %s needs %s of host memory and host %s manages at most %s of it (memory.system.managed_limit)",
			spec.Name, structs.FormatBytes(n.Host), p.cfg.Host, structs.FormatBytes(sys.ManagedLimit)).
			WithDetail("host", p.cfg.Host).WithDetail("domain", sys.Name).
			WithDetail("need_bytes", n.Host).WithDetail("limit_bytes", sys.ManagedLimit)
	}
	return nil
}

// cpuHint tells how a llama.cpp model runs on a host without a GPU.
func cpuHint(eng *structs.EngineRecord) string {
	if eng != nil && eng.Family == structs.FamilyLlamaCpp {
		return ": set engine_config.llamacpp.n_gpu_layers = 0 to run it on the CPU"
	}
	return ""
}
