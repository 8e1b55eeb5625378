// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build cgo && linux

package gpu

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

const gib = int64(1) << 30

// mockCard is a card go-nvml's mock answers for.
func mockCard(uuid, name string, total, used uint64, procs []nvml.ProcessInfo, memRet nvml.Return) *mock.Device {
	return &mock.Device{
		GetUUIDFunc: func() (string, nvml.Return) { return uuid, nvml.SUCCESS },
		GetNameFunc: func() (string, nvml.Return) { return name, nvml.SUCCESS },
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: total, Used: used, Free: total - used}, memRet
		},
		GetComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) { return procs, nvml.SUCCESS },
	}
}

func mockLib(devs ...*mock.Device) *mock.Interface {
	shut := 0
	return &mock.Interface{
		InitFunc:                   func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:               func() nvml.Return { shut++; return nvml.SUCCESS },
		DeviceGetCountFunc:         func() (int, nvml.Return) { return len(devs), nvml.SUCCESS },
		SystemGetDriverVersionFunc: func() (string, nvml.Return) { return "550.54.15", nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if i < 0 || i >= len(devs) {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			return devs[i], nvml.SUCCESS
		},
	}
}

func TestNVML_DevicesAndProcesses(t *testing.T) {
	lib := mockLib(
		mockCard("GPU-aaaa", "NVIDIA GeForce RTX 4090", uint64(24*gib), uint64(600<<20),
			[]nvml.ProcessInfo{{Pid: 4242, UsedGpuMemory: uint64(9 * gib)}, {Pid: 4243, UsedGpuMemory: math.MaxUint64}}, nvml.SUCCESS),
		mockCard("GPU-bbbb", "NVIDIA H200", uint64(141*gib), 0, nil, nvml.SUCCESS),
	)
	p, err := OpenNVML(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.Kind() != KindNVML {
		t.Fatalf("kind %q", p.Kind())
	}
	if inv := Describe(p); inv.Driver != "550.54.15" || len(inv.Devices) != 2 || inv.NoGPU != "" || inv.Kind != KindNVML {
		t.Fatalf("inventory %+v", inv)
	}
	devs, err := p.Devices()
	if err != nil {
		t.Fatal(err)
	}
	want := []Device{
		{Index: 0, UUID: "GPU-aaaa", Name: "NVIDIA GeForce RTX 4090", TotalBytes: 24 * gib, UsedBytes: 600 << 20, FreeBytes: 24*gib - 600<<20},
		{Index: 1, UUID: "GPU-bbbb", Name: "NVIDIA H200", TotalBytes: 141 * gib, FreeBytes: 141 * gib},
	}
	if !reflect.DeepEqual(devs, want) {
		t.Fatalf("devices = %+v\nwant %+v", devs, want)
	}
	procs, err := p.Processes()
	if err != nil {
		t.Fatal(err)
	}
	// The process whose figure NVML withholds is left out.
	if wantP := []ProcessMemory{{PID: 4242, DeviceUUID: "GPU-aaaa", Bytes: 9 * gib}}; !reflect.DeepEqual(procs, wantP) {
		t.Fatalf("processes = %+v, want %+v", procs, wantP)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if len(lib.ShutdownCalls()) != 1 {
		t.Fatalf("shutdown called %d times", len(lib.ShutdownCalls()))
	}
	if _, err := p.Devices(); err == nil {
		t.Fatal("a closed provider answered")
	}
}

func TestNVML_UnifiedMemory(t *testing.T) {
	// A GB10-class GPU reports no memory of its own: the pool is host RAM.
	p, err := OpenNVML(mockLib(mockCard("GPU-gb10", "NVIDIA GB10", 0, 0, nil, nvml.ERROR_NOT_SUPPORTED)))
	if err != nil {
		t.Fatal(err)
	}
	devs, err := p.Devices()
	if err != nil || len(devs) != 1 || !devs[0].Unified || devs[0].TotalBytes != 0 {
		t.Fatalf("devices = %+v, %v", devs, err)
	}
}

func TestNVML_NoGPU(t *testing.T) {
	cases := []struct {
		name string
		lib  nvml.Interface
	}{
		{name: "no library", lib: nil},
		{name: "init fails (no driver)", lib: &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}},
		{name: "driver not loaded", lib: &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }}},
		{name: "no device", lib: mockLib()},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := OpenNVML(c.lib)
			if !errors.Is(err, ErrNoGPU) {
				t.Fatalf("err = %v, want ErrNoGPU", err)
			}
		})
	}
}

func TestNVML_DeviceErrors(t *testing.T) {
	lib := mockLib(mockCard("GPU-aaaa", "x", uint64(gib), 0, nil, nvml.ERROR_GPU_IS_LOST))
	p, err := OpenNVML(lib)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Devices(); err == nil {
		t.Fatal("a lost GPU read as healthy")
	}
}

// TestOpen_AutoWithoutGPU runs on machines without NVIDIA's driver (CI):
// auto falls back to none, nvml is refused with ErrNoGPU, and nothing
// crashes. On a GPU machine it checks that NVML answers.
func TestOpen_AutoWithoutGPU(t *testing.T) {
	p, err := Open(Options{Provider: KindAuto})
	if err != nil {
		t.Fatalf("auto: %v", err)
	}
	defer p.Close()
	if p.Kind() == KindNVML {
		devs, err := p.Devices()
		if err != nil || len(devs) == 0 {
			t.Fatalf("nvml devices: %v %v", devs, err)
		}
		if inv := Describe(p); inv.NoGPU != "" || len(inv.Devices) == 0 {
			t.Fatalf("inventory of a GPU machine: %+v", inv)
		}
		return
	}
	// No GPU: the inventory says why (NVML's own answer), never nothing.
	inv := Describe(p)
	if inv.Kind != KindNone || len(inv.Devices) != 0 || inv.NoGPU == "" || strings.HasPrefix(inv.NoGPU, ErrNoGPU.Error()) {
		t.Fatalf("inventory without a GPU: %+v", inv)
	}
	t.Logf("no GPU found (%s)", inv.NoGPU)
	if _, err := Open(Options{Provider: KindNVML}); !errors.Is(err, ErrNoGPU) {
		t.Fatalf("nvml without a GPU: %v", err)
	}
}
