// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

const simGiB = int64(1) << 30

// writeSim writes a state file whose allocations belong to this test
// process (live), to a PID whose start time differs (reused), and to a PID
// that does not run (dead).
func writeSim(t *testing.T, devs []SimDevice) string {
	t.Helper()
	self := os.Getpid()
	ticks, err := startTicks("/proc", self)
	if err != nil {
		t.Fatal(err)
	}
	f := simFile{Version: SimFormatVersion, Devices: devs, Allocations: []simAllocation{
		{PID: self, StartTicks: ticks, DeviceUUID: devs[0].UUID, Tag: "weights", Bytes: 2 * simGiB},
		{PID: self, StartTicks: ticks, DeviceUUID: devs[0].UUID, Tag: "kv_cache", Bytes: simGiB},
		{PID: self, StartTicks: ticks, DeviceUUID: devs[1].UUID, Tag: "weights", Bytes: 3 * simGiB},
		{PID: self, StartTicks: ticks + 1, DeviceUUID: devs[1].UUID, Tag: "weights", Bytes: 5 * simGiB},
		{PID: 1 << 30, StartTicks: 7, DeviceUUID: devs[1].UUID, Tag: "weights", Bytes: 7 * simGiB},
	}}
	data, _ := json.Marshal(f)
	p := filepath.Join(t.TempDir(), "simgpu.json")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSimulated_DevicesAndProcesses(t *testing.T) {
	devs := SimDevices(2, 24*simGiB, false)
	p, err := OpenSimulated(writeSim(t, devs))
	if err != nil {
		t.Fatal(err)
	}
	got, err := p.Devices()
	if err != nil {
		t.Fatal(err)
	}
	want := []Device{
		{Index: 0, UUID: devs[0].UUID, Name: SimDeviceName, TotalBytes: 24 * simGiB, UsedBytes: 3 * simGiB, FreeBytes: 21 * simGiB},
		{Index: 1, UUID: devs[1].UUID, Name: SimDeviceName, TotalBytes: 24 * simGiB, UsedBytes: 3 * simGiB, FreeBytes: 21 * simGiB},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("devices = %+v\nwant %+v", got, want)
	}
	procs, err := p.Processes()
	if err != nil {
		t.Fatal(err)
	}
	self := os.Getpid()
	wantP := []ProcessMemory{{PID: self, DeviceUUID: devs[0].UUID, Bytes: 3 * simGiB}, {PID: self, DeviceUUID: devs[1].UUID, Bytes: 3 * simGiB}}
	if !reflect.DeepEqual(procs, wantP) {
		t.Fatalf("processes = %+v, want %+v (dead and reused PIDs vanish)", procs, wantP)
	}
}

func TestSimDevices_UUIDs(t *testing.T) {
	// The testkit's simgpu.DefaultDevices derives the same UUIDs.
	d := SimDevices(2, simGiB, false)
	if d[0].UUID != "GPU-"+d[0].UUID[4:] || len(d[0].UUID) != len("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx") || d[0].UUID == d[1].UUID {
		t.Fatalf("uuids %q %q", d[0].UUID, d[1].UUID)
	}
	if u := SimDevices(3, simGiB, true); len(u) != 1 || !u[0].Unified {
		t.Fatalf("a unified simulation has one pool: %+v", u)
	}
}

func TestCreateSimState(t *testing.T) {
	p := filepath.Join(t.TempDir(), "state", "simgpu.json")
	devs := SimDevices(1, 24*simGiB, false)
	if err := CreateSimState(p, devs); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(p)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("state file: %v %v", st, err)
	}
	// An existing file (with the allocations of engines that outlive a
	// restart) is kept, whatever the settings say now.
	if err := CreateSimState(p, SimDevices(4, simGiB, false)); err != nil {
		t.Fatal(err)
	}
	s, err := OpenSimulated(p)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := s.Devices()
	if len(got) != 1 || got[0].TotalBytes != 24*simGiB {
		t.Fatalf("devices after a second create: %+v", got)
	}
	// The testdata file is the testkit's format.
	if _, err := OpenSimulated(filepath.Join("testdata", "sim", "two-cards.json")); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "v2.json")
	_ = os.WriteFile(bad, []byte(`{"version":2,"devices":[]}`), 0o600)
	if _, err := OpenSimulated(bad); err == nil {
		t.Fatal("a newer format version was accepted")
	}
	if _, err := OpenSimulated(filepath.Join(t.TempDir(), "missing.json")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}

func TestOpen_Simulated(t *testing.T) {
	p := filepath.Join(t.TempDir(), "simgpu.json")
	prov, err := Open(Options{Provider: KindSimulated, SimState: p, SimDevices: 2, SimDeviceMemory: 24 * simGiB})
	if err != nil {
		t.Fatal(err)
	}
	devs, err := prov.Devices()
	if err != nil || len(devs) != 2 || devs[1].FreeBytes != 24*simGiB {
		t.Fatalf("devices %+v %v", devs, err)
	}
	if _, err := Open(Options{Provider: KindSimulated}); err == nil {
		t.Fatal("a simulated gpu without a state file was accepted")
	}
	if _, err := Open(Options{Provider: "tpu"}); err == nil {
		t.Fatal("an unknown provider was accepted")
	}
	none, err := Open(Options{Provider: KindNone})
	if err != nil || none.Kind() != KindNone {
		t.Fatalf("none: %v %v", none, err)
	}
}
