// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
)

// SimFormatVersion is the version of the simulated GPU's state file this
// package reads and writes. The format belongs to plugins-testkit/simgpu,
// which the core may not import; it is stable and documented there:
//
//	{"version":1,
//	 "devices":[{"index":0,"uuid":"GPU-…","name":"…","total_bytes":N,"unified":false}],
//	 "allocations":[{"pid":P,"start_ticks":T,"device_uuid":"GPU-…","tag":"weights","bytes":N}]}
//
// Writers replace the file by rename under a flock on "<path>.lock", so a
// reader that does not lock never sees half a file. The core only reads it
// (and creates it once); the entries of dead processes are skipped here, as
// a real card forgets them.
const SimFormatVersion = 1

// SimDeviceName is the product name of the devices SimDevices makes (the
// testkit's simgpu.DefaultDeviceName).
const SimDeviceName = "CapyCTL Simulated GPU"

// SimDevice is one device of the state file.
type SimDevice struct {
	Index      int    `json:"index"`
	UUID       string `json:"uuid"`
	Name       string `json:"name"`
	TotalBytes int64  `json:"total_bytes"`
	Unified    bool   `json:"unified"`
}

// simAllocation is one allocation of the state file.
type simAllocation struct {
	PID        int    `json:"pid"`
	StartTicks uint64 `json:"start_ticks"`
	DeviceUUID string `json:"device_uuid"`
	Tag        string `json:"tag"`
	Bytes      int64  `json:"bytes"`
}

type simFile struct {
	Version     int             `json:"version"`
	Devices     []SimDevice     `json:"devices"`
	Allocations []simAllocation `json:"allocations"`
}

// SimDevices returns n devices of total bytes each, with the UUIDs the
// testkit's simgpu.DefaultDevices derives from the index (so that every run
// agrees on them). With unified, the single pool is unified memory.
func SimDevices(n int, total int64, unified bool) []SimDevice {
	if n < 1 {
		n = 1
	}
	if unified {
		n = 1
	}
	out := make([]SimDevice, 0, n)
	for i := range n {
		sum := sha256.Sum256([]byte("capyctl-simgpu-device-" + strconv.Itoa(i)))
		h := hex.EncodeToString(sum[:16])
		out = append(out, SimDevice{
			Index: i, Name: SimDeviceName, TotalBytes: total, Unified: unified,
			UUID: "GPU-" + h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32],
		})
	}
	return out
}

// CreateSimState writes a fresh state file with devices and no allocations
// (mode 0600), unless one exists: a state file may hold the allocations of
// engines that outlive a role restart, so an existing one is kept as it is.
func CreateSimState(path string, devices []SimDevice) error {
	if _, err := os.Stat(path); err == nil {
		_, err := readSimFile(path)
		return err
	}
	if len(devices) == 0 {
		return fmt.Errorf("create simulated gpu %s: no devices", path)
	}
	for _, d := range devices {
		if d.TotalBytes <= 0 {
			return fmt.Errorf("create simulated gpu %s: device %d has no memory", path, d.Index)
		}
	}
	data, err := json.MarshalIndent(simFile{Version: SimFormatVersion, Devices: devices, Allocations: []simAllocation{}}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("create simulated gpu %s: %w", path, err)
	}
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("create simulated gpu %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if _, err := f.Write(append(data, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("create simulated gpu %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("create simulated gpu %s: %w", path, err)
	}
	// A hard link publishes the whole file, and only if none is there yet.
	if err := os.Link(tmp, path); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("create simulated gpu %s: %w", path, err)
	}
	return nil
}

func readSimFile(path string) (simFile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return simFile{}, fmt.Errorf("read simulated gpu: %w", err)
	}
	var f simFile
	if err := json.Unmarshal(data, &f); err != nil {
		return simFile{}, fmt.Errorf("read simulated gpu %s: %w", path, err)
	}
	if f.Version != SimFormatVersion {
		return simFile{}, fmt.Errorf("read simulated gpu %s: format version %d, this capyctl reads %d", path, f.Version, SimFormatVersion)
	}
	return f, nil
}

// Simulated reads the simulated GPU's state file.
type Simulated struct {
	path     string
	procRoot string
}

// OpenSimulated returns a provider over an existing state file.
func OpenSimulated(path string) (*Simulated, error) {
	if _, err := readSimFile(path); err != nil {
		return nil, err
	}
	return &Simulated{path: path, procRoot: "/proc"}, nil
}

// Path is the state file engines must be given (CAPYCTL_SIMGPU_STATE).
func (s *Simulated) Path() string { return s.path }

// Kind implements Provider.
func (s *Simulated) Kind() string { return KindSimulated }

// live returns the allocations of processes that still run with the
// recorded start time.
func (s *Simulated) live(f simFile) []simAllocation {
	type reading struct {
		ticks uint64
		alive bool
	}
	seen := map[int]reading{}
	var out []simAllocation
	for _, a := range f.Allocations {
		r, ok := seen[a.PID]
		if !ok {
			ticks, err := startTicks(s.procRoot, a.PID)
			r = reading{ticks: ticks, alive: err == nil}
			seen[a.PID] = r
		}
		if r.alive && r.ticks == a.StartTicks {
			out = append(out, a)
		}
	}
	return out
}

// Devices implements Provider.
func (s *Simulated) Devices() ([]Device, error) {
	f, err := readSimFile(s.path)
	if err != nil {
		return nil, err
	}
	used := map[string]int64{}
	for _, a := range s.live(f) {
		used[a.DeviceUUID] += a.Bytes
	}
	out := make([]Device, 0, len(f.Devices))
	for _, d := range f.Devices {
		u := used[d.UUID]
		out = append(out, Device{
			Index: d.Index, UUID: d.UUID, Name: d.Name, Unified: d.Unified,
			TotalBytes: d.TotalBytes, UsedBytes: u, FreeBytes: d.TotalBytes - u,
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out, nil
}

// Processes implements Provider: what each live process holds per device,
// all tags summed.
func (s *Simulated) Processes() ([]ProcessMemory, error) {
	f, err := readSimFile(s.path)
	if err != nil {
		return nil, err
	}
	type key struct {
		pid  int
		uuid string
	}
	sums := map[key]int64{}
	var order []key
	for _, a := range s.live(f) {
		k := key{a.PID, a.DeviceUUID}
		if _, ok := sums[k]; !ok {
			order = append(order, k)
		}
		sums[k] += a.Bytes
	}
	out := make([]ProcessMemory, 0, len(order))
	for _, k := range order {
		out = append(out, ProcessMemory{PID: k.pid, DeviceUUID: k.uuid, Bytes: sums[k]})
	}
	return out, nil
}

// Close implements Provider.
func (s *Simulated) Close() error { return nil }
