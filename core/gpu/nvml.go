// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build cgo && linux

package gpu

import (
	"fmt"
	"math"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// openNVML opens go-nvml's library, which loads libnvidia-ml.so.1 at Init
// (a missing library is an Init error, never a crash).
func openNVML() (Provider, error) {
	p, err := OpenNVML(nvml.New())
	if err != nil {
		return nil, err
	}
	return p, nil
}

// initHints say what an NVML init failure means on the machine, for the
// "no GPU found (...)" line of the banner, the log and capyctl status.
var initHints = map[nvml.Return]string{
	nvml.ERROR_LIBRARY_NOT_FOUND:       "NVIDIA's driver library libnvidia-ml.so.1 is not installed",
	nvml.ERROR_DRIVER_NOT_LOADED:       "NVIDIA's kernel driver is not loaded",
	nvml.ERROR_NO_PERMISSION:           "no permission to open the GPUs (is the role's user in the video group?)",
	nvml.ERROR_LIB_RM_VERSION_MISMATCH: "NVIDIA's driver library and kernel module differ in version (reboot after a driver upgrade)",
}

// NVML reads NVIDIA GPUs through NVML. Tests hand it go-nvml's mock.
type NVML struct {
	lib nvml.Interface

	mu      sync.Mutex
	devices []nvml.Device
	closed  bool
	// driver is the driver's version, read once at open.
	driver string
}

// OpenNVML initialises NVML and lists the devices. An Init that fails (no
// driver, no libnvidia-ml), or a machine with no device, is ErrNoGPU.
func OpenNVML(lib nvml.Interface) (*NVML, error) {
	if lib == nil {
		return nil, fmt.Errorf("%w: no NVML library", ErrNoGPU)
	}
	if ret := lib.Init(); ret != nvml.SUCCESS {
		if hint, ok := initHints[ret]; ok {
			return nil, fmt.Errorf("%w: %s; nvml init: %s", ErrNoGPU, hint, ret.Error())
		}
		return nil, fmt.Errorf("%w: nvml init: %s", ErrNoGPU, ret.Error())
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		_ = lib.Shutdown()
		return nil, fmt.Errorf("nvml device count: %s", ret.Error())
	}
	if n == 0 {
		_ = lib.Shutdown()
		return nil, fmt.Errorf("%w: nvml lists no device", ErrNoGPU)
	}
	p := &NVML{lib: lib}
	if v, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		p.driver = v
	}
	for i := range n {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			_ = lib.Shutdown()
			return nil, fmt.Errorf("nvml device %d: %s", i, ret.Error())
		}
		p.devices = append(p.devices, d)
	}
	return p, nil
}

// Kind implements Provider.
func (p *NVML) Kind() string { return KindNVML }

// DriverVersion is the NVIDIA driver's version ("550.54.15"), or "" when
// NVML did not say.
func (p *NVML) DriverVersion() string { return p.driver }

// Devices implements Provider. A device whose memory NVML does not report
// (a unified-memory GPU such as GB10) is Unified with no total.
func (p *NVML) Devices() ([]Device, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, fmt.Errorf("nvml is closed")
	}
	out := make([]Device, 0, len(p.devices))
	for i, d := range p.devices {
		uuid, ret := d.GetUUID()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvml device %d uuid: %s", i, ret.Error())
		}
		name, ret := d.GetName()
		if ret != nvml.SUCCESS {
			name = "NVIDIA GPU"
		}
		dev := Device{Index: i, UUID: uuid, Name: name}
		mem, ret := d.GetMemoryInfo()
		switch ret {
		case nvml.SUCCESS:
			dev.TotalBytes, dev.UsedBytes, dev.FreeBytes = clampU64(mem.Total), clampU64(mem.Used), clampU64(mem.Free)
		case nvml.ERROR_NOT_SUPPORTED:
			dev.Unified = true
		default:
			return nil, fmt.Errorf("nvml device %d memory: %s", i, ret.Error())
		}
		out = append(out, dev)
	}
	return out, nil
}

// Processes implements Provider: the compute processes of every device and
// what each holds. A process whose figure NVML withholds (no permission,
// another PID namespace) is left out.
func (p *NVML) Processes() ([]ProcessMemory, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, fmt.Errorf("nvml is closed")
	}
	var out []ProcessMemory
	for i, d := range p.devices {
		uuid, ret := d.GetUUID()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvml device %d uuid: %s", i, ret.Error())
		}
		procs, ret := d.GetComputeRunningProcesses()
		if ret == nvml.ERROR_NOT_SUPPORTED {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvml device %d processes: %s", i, ret.Error())
		}
		for _, pr := range procs {
			if pr.UsedGpuMemory == math.MaxUint64 { // NVML_VALUE_NOT_AVAILABLE
				continue
			}
			out = append(out, ProcessMemory{PID: int(pr.Pid), DeviceUUID: uuid, Bytes: clampU64(pr.UsedGpuMemory)})
		}
	}
	return out, nil
}

// Close implements Provider: NVML's shutdown.
func (p *NVML) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	if ret := p.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("nvml shutdown: %s", ret.Error())
	}
	return nil
}

func clampU64(v uint64) int64 {
	if v > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(v)
}
