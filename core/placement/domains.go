// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package placement

import (
	"fmt"

	"github.com/capyctl/capyctl/core/config"
	"github.com/capyctl/capyctl/core/gpu"
	"github.com/capyctl/capyctl/core/ledger"
	"github.com/capyctl/capyctl/core/structs"
)

// Default limits (SPEC D1, reference/original.md §4).
const (
	// SystemManagedPercent and SystemReservePercent are auto for host RAM
	// (and a unified pool).
	SystemManagedPercent = 50
	SystemReservePercent = 20
	// DeviceReservePercent and DeviceReserveMin make a card's auto reserve:
	// max(1 GiB, 8 % of the card); its auto managed limit is the rest.
	DeviceReservePercent = 8
	DeviceReserveMin     = 1 * structs.GiB
)

// isAuto treats an unset amount (a zero value) as auto.
func isAuto(a config.Amount) bool { return a.Auto || (a.Bytes == 0 && a.Percent == 0) }

// BuildDomains turns the machine's inventory and the role's memory settings
// into ledger domains: one unified pool (a unified GPU), or host RAM
// ("system") plus one domain per discrete card ("gpu<index>"). Limits that
// do not fit together are refused as invalid_config naming the setting.
func BuildDomains(devs []gpu.Device, host gpu.HostMemory, mem config.MemoryConfig) ([]ledger.Domain, error) {
	hostCap := host.Capacity()
	var unified, discrete []gpu.Device
	for _, d := range devs {
		if d.Unified {
			unified = append(unified, d)
		} else {
			discrete = append(discrete, d)
		}
	}
	if len(unified) > 0 && len(discrete) > 0 {
		return nil, structs.Errf(structs.CodeInvalidConfig,
			"unsupported gpu topology: %d unified and %d discrete GPUs on one host", len(unified), len(discrete))
	}
	if len(unified) > 1 {
		return nil, structs.Errf(structs.CodeInvalidConfig, "unsupported gpu topology: %d unified GPUs on one host", len(unified))
	}
	if len(unified) == 1 {
		capacity := unified[0].TotalBytes
		if capacity <= 0 {
			capacity = hostCap
		}
		d, err := systemDomain(ledger.DomainUnified, ledger.KindUnified, capacity, mem.System)
		if err != nil {
			return nil, err
		}
		d.DeviceUUID, d.DeviceName = unified[0].UUID, unified[0].Name
		return []ledger.Domain{d}, nil
	}
	sys, err := systemDomain(ledger.DomainSystem, ledger.KindSystem, hostCap, mem.System)
	if err != nil {
		return nil, err
	}
	out := []ledger.Domain{sys}
	for _, d := range discrete {
		dom, err := deviceDomain(d, mem.GPU)
		if err != nil {
			return nil, err
		}
		out = append(out, dom)
	}
	return out, nil
}

// systemDomain resolves host RAM's (or the unified pool's) limits: auto
// is 50 % managed and 20 % reserved.
func systemDomain(name, kind string, capacity int64, l config.DomainLimits) (ledger.Domain, error) {
	if capacity <= 0 {
		return ledger.Domain{}, structs.Errf(structs.CodeInvalidConfig, "the host's memory could not be read")
	}
	managed := resolve(l.ManagedLimit, capacity, SystemManagedPercent)
	reserve := resolve(l.FreeReserve, capacity, SystemReservePercent)
	d := ledger.Domain{Name: name, Kind: kind, Capacity: capacity, ManagedLimit: managed, FreeReserve: reserve}
	if err := d.Validate(); err != nil {
		return ledger.Domain{}, limitsErr("memory.system", l, err)
	}
	return d, nil
}

// deviceDomain resolves a card's limits: auto reserve max(1 GiB, 8 %),
// auto managed limit the card minus the reserve.
func deviceDomain(d gpu.Device, l config.DomainLimits) (ledger.Domain, error) {
	total := d.TotalBytes
	reserve := max(DeviceReserveMin, total*DeviceReservePercent/100)
	if !isAuto(l.FreeReserve) {
		reserve = l.FreeReserve.Resolve(total, 0)
	}
	managed := total - reserve
	if !isAuto(l.ManagedLimit) {
		managed = l.ManagedLimit.Resolve(total, 0)
	}
	dom := ledger.Domain{
		Name: ledger.DeviceDomain(d.Index), Kind: ledger.KindDevice, DeviceUUID: d.UUID, DeviceName: d.Name,
		Capacity: total, ManagedLimit: managed, FreeReserve: reserve,
	}
	if err := dom.Validate(); err != nil {
		return ledger.Domain{}, limitsErr("memory.gpu", l, err)
	}
	return dom, nil
}

func resolve(a config.Amount, capacity int64, autoPercent float64) int64 {
	if isAuto(a) {
		return config.Amount{Auto: true}.Resolve(capacity, autoPercent)
	}
	return a.Resolve(capacity, autoPercent)
}

func limitsErr(prefix string, l config.DomainLimits, err error) *structs.Error {
	return structs.Errf(structs.CodeInvalidConfig,
		"%s.managed_limit = %s and %s.free_reserve = %s do not fit this host: %v",
		prefix, amountText(l.ManagedLimit), prefix, amountText(l.FreeReserve), err).
		WithDetail("setting", prefix+".managed_limit")
}

func amountText(a config.Amount) string {
	if isAuto(a) {
		return "auto"
	}
	return fmt.Sprint(a)
}
