// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package placement

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/config"
	"github.com/capyctl/capyctl/core/gpu"
	"github.com/capyctl/capyctl/core/ledger"
	"github.com/capyctl/capyctl/core/lifecycle"
	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
	"github.com/capyctl/capyctl/sdk"
)

const gib = structs.GiB

// fakeGPU is a provider whose readings a test sets.
type fakeGPU struct {
	mu    sync.Mutex
	devs  []gpu.Device
	procs []gpu.ProcessMemory
}

func (f *fakeGPU) Kind() string { return "fake" }
func (f *fakeGPU) Devices() ([]gpu.Device, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := append([]gpu.Device(nil), f.devs...)
	for i := range out {
		out[i].UsedBytes = 0
		for _, p := range f.procs {
			if p.DeviceUUID == out[i].UUID {
				out[i].UsedBytes += p.Bytes
			}
		}
	}
	return out, nil
}
func (f *fakeGPU) Processes() ([]gpu.ProcessMemory, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]gpu.ProcessMemory(nil), f.procs...), nil
}
func (f *fakeGPU) Close() error { return nil }
func (f *fakeGPU) set(procs ...gpu.ProcessMemory) {
	f.mu.Lock()
	f.procs = procs
	f.mu.Unlock()
}

func cards(n int, total int64) *fakeGPU {
	f := &fakeGPU{}
	for i := range n {
		f.devs = append(f.devs, gpu.Device{Index: i, UUID: "GPU-" + string(rune('a'+i)), Name: "card", TotalBytes: total})
	}
	return f
}

// memStore is the placer's store in memory.
type memStore struct {
	mu   sync.Mutex
	m    map[string]store.Measurement
	meta map[string]string
}

func newMemStore() *memStore {
	return &memStore{m: map[string]store.Measurement{}, meta: map[string]string{}}
}
func (s *memStore) GetMeasurement(k string) (*store.Measurement, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.m[k]
	if !ok {
		return nil, errors.New("not found")
	}
	return &m, nil
}
func (s *memStore) PutMeasurement(k string, m store.Measurement) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[k] = m
	return nil
}
func (s *memStore) Meta(k string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.meta[k]
	if !ok {
		return "", errors.New("not found")
	}
	return v, nil
}
func (s *memStore) SetMeta(k, v string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.meta[k] = v
	return nil
}

// hostFS is a machine with 64 GiB of RAM and no cgroup limit.
func hostFS(t *testing.T) gpu.HostFS {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "meminfo"), []byte("MemTotal: 67108864 kB\nMemAvailable: 33554432 kB\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return gpu.HostFS{ProcRoot: dir, CgroupRoot: dir}
}

func newPlacer(t *testing.T, g gpu.Provider, st Store) *Placer {
	t.Helper()
	p, err := New(Config{Host: "hostA", GPU: g, HostFS: hostFS(t), Store: st, SampleInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func spec(name string, gpuBytes, ramBytes int64) *structs.Deployment {
	return &structs.Deployment{Name: name, Resources: &structs.ResourceSpec{GPU: structs.ByteSize(gpuBytes), RAM: structs.ByteSize(ramBytes)}}
}

func reserve(p *Placer, owner string, d *structs.Deployment) (*lifecycle.Grant, error) {
	return p.Reserve(context.Background(), lifecycle.Reservation{
		Owner: owner, Deployment: d, Revision: 1, Engine: &structs.EngineRecord{Name: "e", Digest: "sha256:x"},
		Hints: &sdk.MemoryHints{}, Residency: structs.ResidencyRestartOnly,
	})
}

func TestBuildDomains(t *testing.T) {
	host := gpu.HostMemory{TotalBytes: 64 * gib}
	card := gpu.Device{Index: 0, UUID: "GPU-a", TotalBytes: 24 * gib}
	small := gpu.Device{Index: 1, UUID: "GPU-b", TotalBytes: 8 * gib}
	pct := func(p float64) config.Amount { return config.Amount{Percent: p} }
	size := func(b int64) config.Amount { return config.Amount{Bytes: structs.ByteSize(b)} }
	cases := []struct {
		name     string
		devs     []gpu.Device
		host     gpu.HostMemory
		mem      config.MemoryConfig
		want     []ledger.Domain
		contains string
	}{
		{
			name: "auto: 50/20 of host RAM, cards keep max(1GiB, 8%)",
			devs: []gpu.Device{card, small}, host: host,
			want: []ledger.Domain{
				{Name: "system", Kind: ledger.KindSystem, Capacity: 64 * gib, ManagedLimit: 32 * gib, FreeReserve: 64 * gib / 5},
				{Name: "gpu0", Kind: ledger.KindDevice, DeviceUUID: "GPU-a", Capacity: 24 * gib, ManagedLimit: 24*gib - 24*gib*8/100, FreeReserve: 24 * gib * 8 / 100},
				{Name: "gpu1", Kind: ledger.KindDevice, DeviceUUID: "GPU-b", Capacity: 8 * gib, ManagedLimit: 7 * gib, FreeReserve: gib},
			},
		},
		{
			name: "cgroup limit bounds host RAM",
			host: gpu.HostMemory{TotalBytes: 64 * gib, CgroupLimit: 16 * gib},
			want: []ledger.Domain{{Name: "system", Kind: ledger.KindSystem, Capacity: 16 * gib, ManagedLimit: 8 * gib, FreeReserve: 16 * gib / 5}},
		},
		{
			name: "sizes and percentages",
			devs: []gpu.Device{card}, host: host,
			mem: config.MemoryConfig{System: config.DomainLimits{ManagedLimit: size(40 * gib), FreeReserve: pct(10)}, GPU: config.DomainLimits{ManagedLimit: pct(75)}},
			want: []ledger.Domain{
				{Name: "system", Kind: ledger.KindSystem, Capacity: 64 * gib, ManagedLimit: 40 * gib, FreeReserve: 64 * gib / 10},
				{Name: "gpu0", Kind: ledger.KindDevice, DeviceUUID: "GPU-a", Capacity: 24 * gib, ManagedLimit: 18 * gib, FreeReserve: 24 * gib * 8 / 100},
			},
		},
		{
			name: "an explicit card reserve sets the managed limit",
			devs: []gpu.Device{card}, host: host,
			mem: config.MemoryConfig{GPU: config.DomainLimits{FreeReserve: size(4 * gib)}},
			want: []ledger.Domain{
				{Name: "system", Kind: ledger.KindSystem, Capacity: 64 * gib, ManagedLimit: 32 * gib, FreeReserve: 64 * gib / 5},
				{Name: "gpu0", Kind: ledger.KindDevice, DeviceUUID: "GPU-a", Capacity: 24 * gib, ManagedLimit: 20 * gib, FreeReserve: 4 * gib},
			},
		},
		{
			name: "unified pool from the GPU's total",
			devs: []gpu.Device{{UUID: "GPU-u", TotalBytes: 128 * gib, Unified: true}}, host: host,
			want: []ledger.Domain{{Name: "unified", Kind: ledger.KindUnified, DeviceUUID: "GPU-u", Capacity: 128 * gib, ManagedLimit: 64 * gib, FreeReserve: 128 * gib / 5}},
		},
		{
			name: "unified pool from host RAM when the GPU reports none",
			devs: []gpu.Device{{UUID: "GPU-u", Unified: true}}, host: host,
			want: []ledger.Domain{{Name: "unified", Kind: ledger.KindUnified, DeviceUUID: "GPU-u", Capacity: 64 * gib, ManagedLimit: 32 * gib, FreeReserve: 64 * gib / 5}},
		},
		{name: "mixed unified and discrete", devs: []gpu.Device{card, {UUID: "GPU-u", Unified: true}}, host: host, contains: "unsupported gpu topology"},
		{name: "system limits that do not fit together", host: host,
			mem: config.MemoryConfig{System: config.DomainLimits{ManagedLimit: size(60 * gib)}}, contains: "memory.system.managed_limit"},
		{name: "system limit above the machine", host: host,
			mem: config.MemoryConfig{System: config.DomainLimits{ManagedLimit: size(100 * gib)}}, contains: "above the capacity"},
		{name: "card reserve above the card", devs: []gpu.Device{small}, host: host,
			mem: config.MemoryConfig{GPU: config.DomainLimits{FreeReserve: size(9 * gib)}}, contains: "memory.gpu"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := BuildDomains(c.devs, c.host, c.mem)
			if c.contains != "" {
				if err == nil || !strings.Contains(err.Error(), c.contains) || !structs.HasCode(err, structs.CodeInvalidConfig) {
					t.Fatalf("err = %v, want invalid_config containing %q", err, c.contains)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for i := range got {
				got[i].DeviceName = ""
			}
			if len(got) != len(c.want) {
				t.Fatalf("domains = %+v", got)
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Fatalf("domain %d = %+v\nwant %+v", i, got[i], c.want[i])
				}
			}
		})
	}
}

func TestPlacer_PinsTheCardWithRoom(t *testing.T) {
	p := newPlacer(t, cards(2, 24*gib), newMemStore())
	g1, err := reserve(p, "big/0", spec("big", 16*gib, gib))
	if err != nil {
		t.Fatal(err)
	}
	if g1.Env["CUDA_VISIBLE_DEVICES"] != "GPU-a" || g1.DeviceUUIDs[0] != "GPU-a" || g1.DeviceBytes != 16*gib || g1.DeviceTotal != 24*gib {
		t.Fatalf("grant 1 = %+v", g1)
	}
	g2, err := reserve(p, "mid/0", spec("mid", 10*gib, gib))
	if err != nil {
		t.Fatal(err)
	}
	if g2.Env["CUDA_VISIBLE_DEVICES"] != "GPU-b" {
		t.Fatalf("grant 2 = %+v, want the card with room", g2)
	}
	// gpu0 has 6.08 GiB free, gpu1 12.08: a third of 10 GiB goes to gpu1.
	g3, err := reserve(p, "small/0", spec("small", 10*gib, gib))
	if err != nil || g3.Env["CUDA_VISIBLE_DEVICES"] != "GPU-b" {
		t.Fatalf("grant 3 = %+v, %v", g3, err)
	}
	_, err = reserve(p, "more/0", spec("more", 8*gib, gib))
	e := structs.AsError(err)
	if e == nil || e.Code != structs.CodeCapacityBlocked || structs.Lookup(e.Code).Exit != 4 {
		t.Fatalf("fourth: %v", err)
	}
	// The refusal names the card with the most room.
	if e.Details["domain"] != "gpu0" || e.Details["host"] != "hostA" || e.Details["need_bytes"] != 8*gib {
		t.Fatalf("details = %v", e.Details)
	}
	if !strings.Contains(e.Message, "host hostA") || !strings.Contains(e.Message, "gpu0: needs 8GiB") {
		t.Fatalf("message = %q", e.Message)
	}
	// Releasing frees the room.
	p.Release("big/0")
	if _, err := reserve(p, "more/0", spec("more", 8*gib, gib)); err != nil {
		t.Fatal(err)
	}
}

func TestPlacer_ExternalMemoryComesOutOfTheReserve(t *testing.T) {
	g := cards(1, 16*gib) // reserve 1.28 GiB, managed 14.72 GiB
	limit := 16*gib - 16*gib*8/100
	p := newPlacer(t, g, newMemStore())
	// A display server holds 700 MiB: inside the reserve, not counted twice.
	g.set(gpu.ProcessMemory{PID: 1, DeviceUUID: "GPU-a", Bytes: 700 << 20})
	if _, err := reserve(p, "a/0", spec("a", limit, gib)); err != nil {
		t.Fatalf("a charge of exactly the managed limit beside 700MiB held outside: %v", err)
	}
	p.Release("a/0")
	// 3 GiB held outside goes past the reserve and narrows the room.
	g.set(gpu.ProcessMemory{PID: 1, DeviceUUID: "GPU-a", Bytes: 3 * gib})
	_, err := reserve(p, "a/0", spec("a", limit, gib))
	if !structs.HasCode(err, structs.CodeCapacityBlocked) || !strings.Contains(err.Error(), "3GiB held outside CapyCTL") {
		t.Fatalf("err = %v", err)
	}
}

func TestPlacer_NoGPU(t *testing.T) {
	p := newPlacer(t, nil, newMemStore())
	g, err := reserve(p, "cpu/0", spec("cpu", 0, 2*gib))
	if err != nil || len(g.Env) != 0 || len(g.DeviceUUIDs) != 0 {
		t.Fatalf("a host-only start: %+v %v", g, err)
	}
	if _, err := reserve(p, "g/0", spec("g", gib, 0)); !structs.HasCode(err, structs.CodeInsufficientDevice) {
		t.Fatalf("a gpu charge without a gpu: %v", err)
	}
	if err := p.Validate(spec("g", gib, 0), nil, nil, ""); !structs.HasCode(err, structs.CodeInsufficientDevice) || strings.Contains(err.Error(), "n_gpu_layers") {
		t.Fatalf("validate a gpu charge without a gpu: %v", err)
	}
	// A llama.cpp model is told how to run on the CPU.
	llama := &structs.EngineRecord{Name: "llamacpp", Family: structs.FamilyLlamaCpp}
	if err := p.Validate(spec("g", gib, 0), llama, nil, ""); !structs.HasCode(err, structs.CodeInsufficientDevice) || !strings.Contains(err.Error(), "n_gpu_layers = 0") {
		t.Fatalf("validate a llama.cpp gpu charge without a gpu: %v", err)
	}
}

// TestPlacer_OffCardModel: a driver estimate with nothing on the card (a
// llama.cpp model with n_gpu_layers = 0) is charged host RAM only, pins no
// card, and runs on a host without a GPU; a partial offload charges each
// side its share.
func TestPlacer_OffCardModel(t *testing.T) {
	cpuHints := &sdk.MemoryHints{WeightsBytes: 4 * gib, KVCacheBytes: gib, ReadyHostBytes: 5 * gib}
	partHints := &sdk.MemoryHints{WeightsBytes: 4 * gib, KVCacheBytes: gib, ReadyDeviceBytes: 3 * gib, ReadyHostBytes: 2 * gib, StartupDeviceBytes: 3 * gib}
	cases := []struct {
		name  string
		gpu   *fakeGPU
		hints *sdk.MemoryHints
		want  map[string]int64
		card  string
	}{
		{name: "cpu only on a card host", gpu: cards(1, 24*gib), hints: cpuHints, want: map[string]int64{"system": 5 * gib}},
		{name: "cpu only without a gpu", gpu: nil, hints: cpuHints, want: map[string]int64{"system": 5 * gib}},
		{name: "partial offload", gpu: cards(1, 24*gib), hints: partHints, want: map[string]int64{"system": 2 * gib, "gpu0": 3 * gib}, card: "GPU-a"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var g gpu.Provider
			if c.gpu != nil {
				g = c.gpu
			}
			p := newPlacer(t, g, newMemStore())
			d := &structs.Deployment{Name: "m"}
			if err := p.Validate(d, nil, c.hints, structs.ResidencyRestartOnly); err != nil {
				t.Fatalf("validate: %v", err)
			}
			gr, err := p.Reserve(context.Background(), lifecycle.Reservation{
				Owner: "m/0", Deployment: d, Revision: 1, Engine: &structs.EngineRecord{Name: "e", Digest: "sha256:x"},
				Hints: c.hints, Residency: structs.ResidencyRestartOnly,
			})
			if err != nil {
				t.Fatalf("reserve: %v", err)
			}
			if gr.Env["CUDA_VISIBLE_DEVICES"] != c.card {
				t.Fatalf("grant = %+v, want card %q", gr, c.card)
			}
			st, _ := p.l.Owner("m/0")
			for dom, b := range st.Charges {
				if b != c.want[dom] {
					t.Fatalf("charges = %v, want %v", st.Charges, c.want)
				}
			}
			for dom, b := range c.want {
				if st.Charges[dom] != b {
					t.Fatalf("charges = %v, want %v", st.Charges, c.want)
				}
			}
		})
	}
}

func TestPlacer_UnifiedChargesTheSum(t *testing.T) {
	p := newPlacer(t, &fakeGPU{devs: []gpu.Device{{UUID: "GPU-u", TotalBytes: 100 * gib, Unified: true}}}, newMemStore())
	if _, err := reserve(p, "a/0", spec("a", 30*gib, 10*gib)); err != nil {
		t.Fatal(err)
	}
	st, _ := p.l.Owner("a/0")
	if st.Charges["unified"] != 40*gib {
		t.Fatalf("charges = %v, want the sum in the pool", st.Charges)
	}
	if _, err := reserve(p, "b/0", spec("b", 5*gib, 6*gib)); !structs.HasCode(err, structs.CodeCapacityBlocked) {
		t.Fatalf("b over the 50GiB pool limit: %v", err)
	}
}

func TestPlacer_Validate(t *testing.T) {
	p := newPlacer(t, cards(2, 24*gib), newMemStore())
	cases := []struct {
		name string
		spec *structs.Deployment
		code structs.Code
	}{
		{name: "fits", spec: spec("a", 20*gib, 4*gib)},
		{name: "card charge above every card", spec: spec("a", 23*gib, gib), code: structs.CodeInsufficientDevice},
		{name: "host charge above the host's limit", spec: spec("a", gib, 33*gib), code: structs.CodeInsufficientMemory},
		{name: "declared startup above every card", spec: &structs.Deployment{Name: "a", Resources: &structs.ResourceSpec{Phases: map[string]structs.PhaseCharge{
			"startup": {GPU: structs.ByteSize(30 * gib)}, "ready": {GPU: structs.ByteSize(10 * gib)}}}}, code: structs.CodeInsufficientDevice},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := p.Validate(c.spec, nil, &sdk.MemoryHints{}, structs.ResidencyRestartOnly)
			if c.code == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			e := structs.AsError(err)
			if e == nil || e.Code != c.code || structs.Lookup(e.Code).Exit != 4 {
				t.Fatalf("err = %v, want %s", err, c.code)
			}
		})
	}
	// Derived from the weights: an estimate above the card starts alone.
	if err := p.Validate(&structs.Deployment{Name: "w"}, nil, &sdk.MemoryHints{WeightsBytes: 8 * gib}, structs.ResidencyDeep); err != nil {
		t.Fatalf("a derived start that fits once ready: %v", err)
	}
	if err := p.Validate(&structs.Deployment{Name: "w"}, nil, &sdk.MemoryHints{WeightsBytes: 30 * gib}, structs.ResidencyDeep); !structs.HasCode(err, structs.CodeInsufficientDevice) {
		t.Fatalf("weights larger than any card: %v", err)
	}
}

// startEngine starts a real process in its own group, standing for an
// engine: its resident memory is what the sampler reads.
func startEngine(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _, _ = cmd.Process.Wait() })
	return cmd
}

func TestPlacer_MeasuresTheStartupPeak(t *testing.T) {
	g := cards(1, 24*gib)
	st := newMemStore()
	p, err := New(Config{Host: "hostA", GPU: g, HostFS: gpu.HostFS{ProcRoot: "/proc", CgroupRoot: t.TempDir()}, Store: st, SampleInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	d := &structs.Deployment{Name: "m", Resources: &structs.ResourceSpec{Phases: map[string]structs.PhaseCharge{"ready": {GPU: structs.ByteSize(4 * gib), RAM: 1 << 20}}}}
	if _, err := reserve(p, "m/0", d); err != nil {
		t.Fatal(err)
	}
	eng := startEngine(t)
	pid := eng.Process.Pid
	// The engine holds 6 GiB while it starts; another process holds 2 GiB.
	g.set(gpu.ProcessMemory{PID: pid, DeviceUUID: "GPU-a", Bytes: 6 * gib}, gpu.ProcessMemory{PID: 1, DeviceUUID: "GPU-a", Bytes: 2 * gib})
	p.Launched("m/0", pid, []structs.ProcessIdentity{{PID: pid, Role: "engine"}})
	deadline := time.Now().Add(30 * time.Second)
	for {
		mv, _ := p.Memory("m", 1)
		if mv.Startup.ObservedDeviceBytes == 6*gib && mv.Startup.ObservedHostBytes > 0 {
			if mv.Startup.DeviceProvenance != ledger.ProvPlaceholder {
				t.Fatalf("first start provenance %q", mv.Startup.DeviceProvenance)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sampler never saw the peak: %+v", mv.Startup)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Ready: the transient is gone, the peak is stored.
	g.set(gpu.ProcessMemory{PID: pid, DeviceUUID: "GPU-a", Bytes: 3 * gib})
	if err := p.Phase("m/0", ledger.PhaseReady); err != nil {
		t.Fatal(err)
	}
	key := MeasurementKey("m", 1, "hostA", &structs.EngineRecord{Name: "e", Digest: "sha256:x"})
	m, err := st.GetMeasurement(key)
	if err != nil || m.DeviceBytes != 6*gib || m.HostBytes <= 0 || m.Provenance != ledger.ProvMeasured || m.Samples == 0 {
		t.Fatalf("measurement = %+v, %v", m, err)
	}
	// Its GPU memory is CapyCTL's, not held outside it.
	snap := p.l.Snapshot()
	if snap.Domains[1].External != 2*gib {
		t.Fatalf("external = %d, want only the other process's 2GiB", snap.Domains[1].External)
	}
	p.Release("m/0")
	// The next start reserves the measurement.
	if _, err := reserve(p, "m/0", d); err != nil {
		t.Fatal(err)
	}
	mv, _ := p.Memory("m", 1)
	if mv.Startup.DeviceBytes != 6*gib || mv.Startup.DeviceProvenance != ledger.ProvMeasured || mv.Startup.HostProvenance != ledger.ProvMeasured {
		t.Fatalf("second start: %+v", mv.Startup)
	}
	if mv.Measured == nil || mv.Measured.DeviceBytes != 6*gib {
		t.Fatalf("the view shows no stored measurement: %+v", mv.Measured)
	}
	// A second start that peaks lower: the stored peak keeps the larger.
	p.Launched("m/0", pid, []structs.ProcessIdentity{{PID: pid, Role: "engine"}})
	g.set(gpu.ProcessMemory{PID: pid, DeviceUUID: "GPU-a", Bytes: 5 * gib})
	poll.Until(t, 30*time.Second, "the sampler to see the second start", func() bool {
		mv, _ := p.Memory("m", 1)
		return mv.Startup.ObservedDeviceBytes == 5*gib
	})
	if err := p.Phase("m/0", ledger.PhaseReady); err != nil {
		t.Fatal(err)
	}
	if m, _ := st.GetMeasurement(key); m.DeviceBytes != 6*gib {
		t.Fatalf("a lower second peak replaced the stored one: %+v", m)
	}
	p.Release("m/0")
	if _, err := reserve(p, "m/0", d); err != nil {
		t.Fatal(err)
	}
	// A failed start's partial peak is discarded.
	p.Launched("m/0", pid, []structs.ProcessIdentity{{PID: pid, Role: "engine"}})
	g.set(gpu.ProcessMemory{PID: pid, DeviceUUID: "GPU-a", Bytes: 20 * gib})
	p.Release("m/0")
	if m, _ := st.GetMeasurement(key); m.DeviceBytes != 6*gib {
		t.Fatalf("a failed start changed the measurement: %+v", m)
	}
}

func TestPlacer_RestoreAfterRestart(t *testing.T) {
	g := cards(1, 24*gib)
	st := newMemStore()
	p := newPlacer(t, g, st)
	if _, err := reserve(p, "a/0", spec("a", 10*gib, gib)); err != nil {
		t.Fatal(err)
	}
	if err := p.Phase("a/0", ledger.PhaseReady); err != nil {
		t.Fatal(err)
	}
	if _, err := reserve(p, "b/0", spec("b", 5*gib, gib)); err != nil {
		t.Fatal(err)
	}
	p.Release("b/0")

	// A new role on the same store re-reads the running instance's charge;
	// a record in a stopped state charges nothing.
	q := newPlacer(t, g, st)
	q.Restore([]structs.InstanceRecord{
		{Deployment: "a", Index: 0, State: structs.StateReady, Launch: &structs.LaunchRecord{Pgid: 1}},
		{Deployment: "b", Index: 0, State: structs.StateReady, Launch: &structs.LaunchRecord{Pgid: 2}},
		{Deployment: "c", Index: 0, State: structs.StateStopped, Launch: &structs.LaunchRecord{Pgid: 3}},
	})
	sa, ok := q.l.Owner("a/0")
	if !ok || sa.Phase != ledger.PhaseReady || sa.Charges["gpu0"] != 10*gib || sa.Charges["system"] != gib {
		t.Fatalf("restored a = %+v %v", sa, ok)
	}
	if q.l.Has("b/0") || q.l.Has("c/0") {
		t.Fatal("a released or stopped instance was charged")
	}
	// The lifecycle's recovery proves it gone: released for good.
	q.Release("a/0")
	r := newPlacer(t, g, st)
	r.Restore([]structs.InstanceRecord{{Deployment: "a", Index: 0, State: structs.StateReady, Launch: &structs.LaunchRecord{Pgid: 1}}})
	if r.l.Has("a/0") {
		t.Fatal("a released instance came back after a restart")
	}
}

func TestPlacer_DeploymentExtras(t *testing.T) {
	p := newPlacer(t, cards(1, 24*gib), newMemStore())
	if _, err := reserve(p, "a/0", spec("a", 10*gib, gib)); err != nil {
		t.Fatal(err)
	}
	mv, owners := p.Memory("a", 1)
	if mv.Domain != "gpu0" || mv.Startup.DeviceProvenance != ledger.ProvDeclared || mv.Ready.DeviceBytes != 10*gib || len(mv.Ledger) != 2 {
		t.Fatalf("memory view = %+v", mv)
	}
	if owners["a/0"].Charges["gpu0"] != 10*gib {
		t.Fatalf("owners = %+v", owners)
	}
	h := p.Host()
	if len(h.GPUs) != 1 || h.GPUKind != "fake" {
		t.Fatalf("host = %+v", h)
	}
}

func TestPlacer_MeasuresTheParkedResidue(t *testing.T) {
	g := cards(1, 24*gib)
	st := newMemStore()
	p, err := New(Config{Host: "hostA", GPU: g, HostFS: gpu.HostFS{ProcRoot: "/proc", CgroupRoot: t.TempDir()}, Store: st, SampleInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	d := spec("p", 10*gib, gib)
	res := func() (*lifecycle.Grant, error) {
		return p.Reserve(context.Background(), lifecycle.Reservation{Owner: "p/0", Deployment: d, Revision: 1,
			Engine: &structs.EngineRecord{Name: "e"}, Residency: structs.ResidencyDeep})
	}
	if _, err := res(); err != nil {
		t.Fatal(err)
	}
	eng := startEngine(t)
	pid := eng.Process.Pid
	p.Launched("p/0", pid, []structs.ProcessIdentity{{PID: pid, Role: "engine"}})
	if err := p.Phase("p/0", ledger.PhaseReady); err != nil {
		t.Fatal(err)
	}
	if err := p.Phase("p/0", ledger.PhaseParked); err != nil {
		t.Fatal(err)
	}
	if o, _ := p.l.Owner("p/0"); o.Charges["gpu0"] != gib {
		t.Fatalf("parked placeholder: %v", o.Charges)
	}
	// The parked engine still holds 2.5 GiB: that is charged, and kept.
	g.set(gpu.ProcessMemory{PID: pid, DeviceUUID: "GPU-a", Bytes: 5 * gib / 2})
	p.Parked("p/0")
	if o, _ := p.l.Owner("p/0"); o.Charges["gpu0"] != 5*gib/2 {
		t.Fatalf("parked charge after the measurement: %v", o.Charges)
	}
	pkey := ParkedKey("p", 1, "hostA", &structs.EngineRecord{Name: "e"})
	if m, err := st.GetMeasurement(pkey); err != nil || m.DeviceBytes != 5*gib/2 || m.Samples != 1 {
		t.Fatalf("stored residue: %+v %v", m, err)
	}
	if mv, _ := p.Memory("p", 1); mv.Parked.DeviceBytes != 5*gib/2 {
		t.Fatalf("the deployment's parked charge after the measurement: %+v", mv.Parked)
	}
	p.Release("p/0")
	if _, err := res(); err != nil {
		t.Fatal(err)
	}
	mv, _ := p.Memory("p", 1)
	if mv.Parked.DeviceBytes != 5*gib/2 || mv.Parked.Provenance != ledger.ProvMeasured {
		t.Fatalf("next start's parked charge: %+v", mv.Parked)
	}
	// A park that reads nothing on the card measures nothing: the charge
	// measured before stays (a reading of 0 is no evidence of a smaller
	// residue).
	p.Launched("p/0", pid, []structs.ProcessIdentity{{PID: pid, Role: "engine"}})
	if err := p.Phase("p/0", ledger.PhaseReady); err != nil {
		t.Fatal(err)
	}
	if err := p.Phase("p/0", ledger.PhaseParked); err != nil {
		t.Fatal(err)
	}
	g.set(gpu.ProcessMemory{PID: pid, DeviceUUID: "GPU-a", Bytes: 0})
	p.Parked("p/0")
	if o, _ := p.l.Owner("p/0"); o.Charges["gpu0"] != 5*gib/2 {
		t.Fatalf("parked charge after a reading of nothing: %v, want the measured %d kept", o.Charges, 5*gib/2)
	}
	if m, _ := st.GetMeasurement(pkey); m.Samples != 1 {
		t.Fatalf("a reading of nothing was stored: %+v", m)
	}
	// A smaller residue later: the stored one keeps the largest seen.
	g.set(gpu.ProcessMemory{PID: pid, DeviceUUID: "GPU-a", Bytes: 2 * gib})
	p.Parked("p/0")
	if m, _ := st.GetMeasurement(pkey); m.DeviceBytes != 5*gib/2 || m.Samples != 2 {
		t.Fatalf("stored residue after a smaller one: %+v, want the larger kept", m)
	}
}

func TestPlacer_Adopt(t *testing.T) {
	g := cards(1, 24*gib)
	st := newMemStore()
	p := newPlacer(t, g, st)
	if _, err := reserve(p, "a/0", spec("a", 10*gib, gib)); err != nil {
		t.Fatal(err)
	}
	// A restarted role: Restore saw the instance starting; the lifecycle's
	// re-attach proves it ready.
	q := newPlacer(t, g, st)
	rec := structs.InstanceRecord{Deployment: "a", Index: 0, State: structs.StateStarting, Launch: &structs.LaunchRecord{Pgid: 1}}
	q.Restore([]structs.InstanceRecord{rec})
	if o, _ := q.l.Owner("a/0"); o.Phase != ledger.PhaseStartup {
		t.Fatalf("restored phase %q", o.Phase)
	}
	q.Adopt("a/0", ledger.PhaseReady, rec)
	if o, _ := q.l.Owner("a/0"); o.Phase != ledger.PhaseReady || o.Charges["gpu0"] != 10*gib {
		t.Fatalf("adopted: %+v", o)
	}
	// Adopt alone (no Restore) reads the recorded charge too.
	r := newPlacer(t, g, st)
	r.Adopt("a/0", ledger.PhaseParked, rec)
	if o, ok := r.l.Owner("a/0"); !ok || o.Phase != ledger.PhaseParked {
		t.Fatalf("adopt without restore: %+v %v", o, ok)
	}
}

// TestPlacer_CompilersAreLeftOut: a kernel build the engine runs during
// its first start (here a process named ninja, the engine's child, holding
// GPU memory in the provider's readings) is not part of the startup peak.
func TestPlacer_CompilersAreLeftOut(t *testing.T) {
	sleepPath, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep program")
	}
	if real, _ := filepath.EvalSymlinks(sleepPath); strings.Contains(filepath.Base(real), "busybox") {
		t.Skip("sleep is busybox: a copy named ninja would not run")
	}
	data, err := os.ReadFile(sleepPath)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ninja := filepath.Join(dir, "ninja")
	if err := os.WriteFile(ninja, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", ninja+" 60 & exec "+sleepPath+" 60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	engine := cmd.Process.Pid
	t.Cleanup(func() { _ = syscall.Kill(-engine, syscall.SIGKILL); _, _ = cmd.Process.Wait() })
	var ninjaPID int
	deadline := time.Now().Add(30 * time.Second)
	for ninjaPID == 0 {
		for _, pr := range gpu.DefaultHostFS.Processes() {
			if pr.Comm == "ninja" && pr.PGID == engine {
				ninjaPID = pr.PID
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the compiler process did not appear")
		}
		time.Sleep(5 * time.Millisecond)
	}

	g := cards(1, 24*gib)
	st := newMemStore()
	p, err := New(Config{Host: "hostA", GPU: g, HostFS: gpu.HostFS{ProcRoot: "/proc", CgroupRoot: t.TempDir()}, Store: st, SampleInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := reserve(p, "c/0", spec("c", 4*gib, gib)); err != nil {
		t.Fatal(err)
	}
	g.set(gpu.ProcessMemory{PID: engine, DeviceUUID: "GPU-a", Bytes: 2 * gib}, gpu.ProcessMemory{PID: ninjaPID, DeviceUUID: "GPU-a", Bytes: 5 * gib})
	p.Launched("c/0", engine, []structs.ProcessIdentity{{PID: engine, Role: "engine"}})
	for {
		mv, _ := p.Memory("c", 1)
		if mv.Startup.ObservedSamples > 0 {
			if mv.Startup.ObservedDeviceBytes != 2*gib {
				t.Fatalf("observed %d on the card, want the engine's 2GiB without the compiler's 5GiB", mv.Startup.ObservedDeviceBytes)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no sample")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := p.Phase("c/0", ledger.PhaseReady); err != nil {
		t.Fatal(err)
	}
	key := MeasurementKey("c", 1, "hostA", &structs.EngineRecord{Name: "e", Digest: "sha256:x"})
	if m, err := st.GetMeasurement(key); err != nil || m.DeviceBytes != 2*gib {
		t.Fatalf("measurement = %+v %v", m, err)
	}
}

// TestPlacer_ParkedHostChargesHostRAM: a park that keeps the weights in
// host RAM (parked_host, vLLM's sleep level 1) is charged their copy in the
// system domain and is admitted only while host RAM has room for it; a
// park that drops them (parked) is not; on a unified pool there is no such
// park.
func TestPlacer_ParkedHostChargesHostRAM(t *testing.T) {
	p := newPlacer(t, cards(1, 80*gib), newMemStore()) // host RAM: 32 GiB managed
	vllm := func(name string) error {
		_, err := p.Reserve(context.Background(), lifecycle.Reservation{
			Owner: name + "/0", Deployment: &structs.Deployment{Name: name}, Revision: 1, Engine: &structs.EngineRecord{Name: "e"},
			Hints: &sdk.MemoryHints{WeightsBytes: 8 * gib}, Residency: structs.ResidencyDeep,
		})
		if err == nil {
			err = p.Phase(name+"/0", ledger.PhaseReady)
		}
		return err
	}
	for _, n := range []string{"a", "b"} {
		if err := vllm(n); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := reserve(p, "c/0", spec("c", 4*gib, 6*gib)); err != nil {
		t.Fatal(err)
	}
	host := func(owner string) int64 {
		now, _, ok := p.Charges(owner)
		if !ok {
			t.Fatalf("%s is not charged", owner)
		}
		return now[ledger.DomainSystem]
	}
	// a: its 4 GiB of host overhead and the copy of its weights (8 × 1.5).
	if err := p.Phase("a/0", ledger.PhaseParkedHost); err != nil {
		t.Fatalf("a parks with its weights in host RAM: %v", err)
	}
	if got := host("a/0"); got != 16*gib {
		t.Fatalf("a parked_host charges %s of host RAM, want 16GiB", structs.FormatBytes(got))
	}
	// b: 16 + 16 + 6 GiB would pass the 32 GiB limit.
	err := p.Phase("b/0", ledger.PhaseParkedHost)
	if !structs.HasCode(err, structs.CodeCapacityBlocked) || !strings.Contains(err.Error(), "system") {
		t.Fatalf("b parked_host: %v, want capacity_blocked on system", err)
	}
	if err := p.Phase("b/0", ledger.PhaseParked); err != nil {
		t.Fatalf("b parks dropping its weights: %v", err)
	}
	if got := host("b/0"); got != 4*gib {
		t.Fatalf("b parked charges %s of host RAM, want 4GiB", structs.FormatBytes(got))
	}

	u := newPlacer(t, &fakeGPU{devs: []gpu.Device{{UUID: "GPU-u", TotalBytes: 128 * gib, Unified: true}}}, newMemStore())
	if _, err := u.Reserve(context.Background(), lifecycle.Reservation{
		Owner: "a/0", Deployment: &structs.Deployment{Name: "a"}, Revision: 1, Engine: &structs.EngineRecord{Name: "e"},
		Hints: &sdk.MemoryHints{WeightsBytes: 8 * gib}, Residency: structs.ResidencyDeep,
	}); err != nil {
		t.Fatal(err)
	}
	if err := u.Phase("a/0", ledger.PhaseReady); err != nil {
		t.Fatal(err)
	}
	if err := u.Phase("a/0", ledger.PhaseParkedHost); !structs.HasCode(err, structs.CodeCapacityBlocked) {
		t.Fatalf("parked_host on a unified pool: %v, want refused", err)
	}
}

// TestPlacer_PhaseThenWritesOnRecord: PhaseThen moves the charge at once
// and writes the charge's record only when record runs (the phase then
// current); a release before record leaves the release recorded.
func TestPlacer_PhaseThenWritesOnRecord(t *testing.T) {
	st := newMemStore()
	p := newPlacer(t, cards(1, 24*gib), st)
	d := &structs.Deployment{Name: "m", Resources: &structs.ResourceSpec{Phases: map[string]structs.PhaseCharge{"ready": {GPU: structs.ByteSize(4 * gib), RAM: 1 << 20}}}}
	phaseOf := func() string {
		v, err := st.Meta(metaPrefix + "m/0")
		if err != nil || v == "" {
			return ""
		}
		var info ownerInfo
		if err := json.Unmarshal([]byte(v), &info); err != nil {
			t.Fatal(err)
		}
		return info.Phase
	}
	if _, err := reserve(p, "m/0", d); err != nil {
		t.Fatal(err)
	}
	record, err := p.PhaseThen("m/0", ledger.PhaseReady)
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := p.l.Owner("m/0"); !ok || o.Phase != ledger.PhaseReady {
		t.Fatalf("the charge is not ready at once: %+v", o)
	}
	if got := phaseOf(); got != ledger.PhaseStartup {
		t.Fatalf("recorded %q before record ran, want startup", got)
	}
	record()
	if got := phaseOf(); got != ledger.PhaseReady {
		t.Fatalf("recorded %q after record, want ready", got)
	}
	// A release between the change and its record: the release stands.
	record, err = p.PhaseThen("m/0", ledger.PhaseParked)
	if err != nil {
		t.Fatal(err)
	}
	p.Release("m/0")
	record()
	if got := phaseOf(); got != "" {
		t.Fatalf("recorded %q after a release", got)
	}
}

// TestPlacer_ReserveUnrecordedWritesWithTheLaunch: ReserveUnrecorded
// charges at once and writes nothing; WithCharge hands the charge record to
// the launch record's write. A restart before that write finds neither
// charge nor launch (nothing charged, nothing running); after it, the
// restarted role charges the recorded launch once, in its phase.
func TestPlacer_ReserveUnrecordedWritesWithTheLaunch(t *testing.T) {
	g := cards(1, 24*gib)
	st := newMemStore()
	p := newPlacer(t, g, st)
	req := lifecycle.Reservation{
		Owner: "a/0", Deployment: spec("a", 10*gib, gib), Revision: 1, Engine: &structs.EngineRecord{Name: "e", Digest: "sha256:x"},
		Hints: &sdk.MemoryHints{}, Residency: structs.ResidencyRestartOnly,
	}
	if _, err := p.ReserveUnrecorded(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if !p.l.Has("a/0") {
		t.Fatal("not charged at once")
	}
	if v, err := st.Meta(metaPrefix + "a/0"); err == nil {
		t.Fatalf("charge record written before the launch record: %q", v)
	}
	// A crash here: the launch was never recorded (the record's state is
	// the one before the start) and nothing is charged after the restart.
	q := newPlacer(t, g, st)
	q.Restore([]structs.InstanceRecord{{Deployment: "a", Index: 0, State: structs.StateStopped}})
	if q.l.Has("a/0") {
		t.Fatal("charged after a crash before the launch record")
	}
	// The launch record's write carries the charge record.
	launch := structs.InstanceRecord{Deployment: "a", Index: 0, State: structs.StateStarting, Launch: &structs.LaunchRecord{Pgid: 1}}
	if err := p.WithCharge("a/0", func(meta map[string]string) error {
		if len(meta) != 1 {
			t.Fatalf("meta %v, want the one charge record", meta)
		}
		for k, v := range meta {
			if err := st.SetMeta(k, v); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	r := newPlacer(t, g, st)
	r.Restore([]structs.InstanceRecord{launch})
	sa, ok := r.l.Owner("a/0")
	if !ok || sa.Phase != ledger.PhaseStartup || sa.Charges["gpu0"] != 10*gib {
		t.Fatalf("restored %+v %v, want the startup charge of the recorded launch", sa, ok)
	}
	// An owner released before its launch record carries no charge record.
	p.Release("a/0")
	if err := p.WithCharge("a/0", func(meta map[string]string) error {
		if len(meta) != 0 {
			t.Fatalf("a released owner's charge record: %v", meta)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
