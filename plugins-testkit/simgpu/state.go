// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package simgpu is a simulated GPU shared by the processes of a test: a
// small JSON state file that lists the devices and, per process, what each
// one holds on them. Fake engines allocate and free through it, and a
// simulated GPU provider reads it the way the NVML provider reads a real
// card: per device, per process, with the entries of dead processes gone.
//
// Every read-modify-write happens under an exclusive flock(2) on a lock file
// beside the state file ("<path>.lock"), and the state file is replaced by
// rename, so a reader that does not lock never sees a half-written file.
//
// The file format (version 1) is stable so that programs which cannot import
// this package can read it:
//
//	{"version":1,
//	 "devices":[{"index":0,"uuid":"GPU-…","name":"…","total_bytes":N,"unified":false}],
//	 "allocations":[{"pid":P,"start_ticks":T,"device_uuid":"GPU-…","tag":"weights","bytes":N}]}
package simgpu

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// FormatVersion is the version of the state file this package writes.
const FormatVersion = 1

// DefaultDeviceName is the product name DefaultDevices gives its devices.
const DefaultDeviceName = "CapyCTL Simulated GPU"

// Device is one simulated card.
type Device struct {
	// Index is the device's CUDA index (the order of nvidia-smi).
	Index int `json:"index"`
	// UUID is the NVML form, "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
	UUID string `json:"uuid"`
	// Name is the product name.
	Name string `json:"name"`
	// TotalBytes is the device's memory.
	TotalBytes int64 `json:"total_bytes"`
	// Unified marks memory shared with the host (a GB10-like machine).
	Unified bool `json:"unified"`
}

// Allocation is what one process holds on one device under one tag.
type Allocation struct {
	// PID is the holding process.
	PID int `json:"pid"`
	// StartTicks is field 22 of /proc/<pid>/stat when the allocation was
	// made: a PID whose start time differs was reused by another process.
	StartTicks uint64 `json:"start_ticks"`
	// DeviceUUID names the device.
	DeviceUUID string `json:"device_uuid"`
	// Tag says what the memory is for ("weights", "kv_cache", …).
	Tag string `json:"tag"`
	// Bytes is the size held.
	Bytes int64 `json:"bytes"`
}

// State is the whole simulated GPU: devices and allocations.
type State struct {
	// Devices lists the cards, ordered by index.
	Devices []Device `json:"devices"`
	// Allocations lists what processes hold.
	Allocations []Allocation `json:"allocations"`
}

// fileState is the on-disk form of State.
type fileState struct {
	Version     int          `json:"version"`
	Devices     []Device     `json:"devices"`
	Allocations []Allocation `json:"allocations"`
}

// Create writes a fresh state with devices and no allocations at path (mode
// 0600). It refuses to replace an existing file (the error wraps
// fs.ErrExist): a state file may hold allocations of live processes, so a
// caller that wants a fresh GPU removes the old file first, knowingly.
func Create(path string, devices []Device) error {
	if err := validateDevices(devices); err != nil {
		return fmt.Errorf("create simulated gpu %s: %w", path, err)
	}
	data, err := encode(State{Devices: devices})
	if err != nil {
		return fmt.Errorf("create simulated gpu %s: %w", path, err)
	}
	tmp, err := writeTemp(path, data)
	if err != nil {
		return fmt.Errorf("create simulated gpu %s: %w", path, err)
	}
	defer os.Remove(tmp)
	// A hard link publishes the complete file only if nothing is there yet.
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("create simulated gpu %s: %w", path, fs.ErrExist)
		}
		return fmt.Errorf("create simulated gpu %s: %w", path, err)
	}
	return nil
}

// DefaultDevices returns n discrete devices of total bytes each, indexed
// from 0, with UUIDs derived from the index so that every run agrees.
func DefaultDevices(n int, total int64) []Device {
	devs := make([]Device, 0, n)
	for i := range n {
		devs = append(devs, Device{
			Index:      i,
			UUID:       deviceUUID(i),
			Name:       DefaultDeviceName,
			TotalBytes: total,
		})
	}
	return devs
}

// deviceUUID makes the NVML-shaped UUID of device i.
func deviceUUID(i int) string {
	sum := sha256.Sum256([]byte("capyctl-simgpu-device-" + strconv.Itoa(i)))
	h := hex.EncodeToString(sum[:16])
	return "GPU-" + h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// ResolveDevice finds the device a process uses as cuda:0 given its
// CUDA_VISIBLE_DEVICES value: an index ("1"), a full UUID ("GPU-…"), or a
// unique UUID prefix of at least "GPU-" plus one character, as CUDA accepts.
// A list ("1,0") resolves its first entry; an empty value means index 0.
func ResolveDevice(st State, visible string) (Device, error) {
	v := strings.TrimSpace(visible)
	if first, _, ok := strings.Cut(v, ","); ok {
		v = strings.TrimSpace(first)
	}
	if v == "" {
		v = "0"
	}
	if strings.HasPrefix(v, "GPU-") {
		var found []Device
		for _, d := range st.Devices {
			if d.UUID == v {
				return d, nil
			}
			if len(v) > len("GPU-") && strings.HasPrefix(d.UUID, v) {
				found = append(found, d)
			}
		}
		switch len(found) {
		case 1:
			return found[0], nil
		case 0:
			return Device{}, fmt.Errorf("resolve device %q: %w", visible, ErrNoDevice)
		default:
			return Device{}, fmt.Errorf("resolve device %q: uuid prefix is ambiguous: %w", visible, ErrNoDevice)
		}
	}
	idx, err := strconv.Atoi(v)
	if err != nil || idx < 0 {
		return Device{}, fmt.Errorf("resolve device %q: not an index or a GPU uuid: %w", visible, ErrNoDevice)
	}
	for _, d := range st.Devices {
		if d.Index == idx {
			return d, nil
		}
	}
	return Device{}, fmt.Errorf("resolve device %q: no device with index %d: %w", visible, idx, ErrNoDevice)
}

// validateDevices refuses duplicate indexes or UUIDs and empty devices.
func validateDevices(devices []Device) error {
	if len(devices) == 0 {
		return errors.New("no devices")
	}
	idx := map[int]bool{}
	uuids := map[string]bool{}
	for _, d := range devices {
		switch {
		case !strings.HasPrefix(d.UUID, "GPU-"):
			return fmt.Errorf("device %d: uuid %q does not start with \"GPU-\"", d.Index, d.UUID)
		case d.TotalBytes <= 0:
			return fmt.Errorf("device %s: total bytes must be positive", d.UUID)
		case d.Index < 0:
			return fmt.Errorf("device %s: negative index", d.UUID)
		case idx[d.Index]:
			return fmt.Errorf("device index %d appears twice", d.Index)
		case uuids[d.UUID]:
			return fmt.Errorf("device uuid %s appears twice", d.UUID)
		}
		idx[d.Index] = true
		uuids[d.UUID] = true
	}
	return nil
}

// encode renders st in the file format.
func encode(st State) ([]byte, error) {
	f := fileState{Version: FormatVersion, Devices: st.Devices, Allocations: st.Allocations}
	if f.Devices == nil {
		f.Devices = []Device{}
	}
	if f.Allocations == nil {
		f.Allocations = []Allocation{}
	}
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode state: %w", err)
	}
	return append(data, '\n'), nil
}

// decode parses the file format.
func decode(data []byte) (State, error) {
	var f fileState
	if err := json.Unmarshal(data, &f); err != nil {
		return State{}, fmt.Errorf("decode state: %w", err)
	}
	if f.Version != FormatVersion {
		return State{}, fmt.Errorf("decode state: format version %d, want %d", f.Version, FormatVersion)
	}
	return State{Devices: f.Devices, Allocations: f.Allocations}, nil
}

// readState reads and decodes the state file.
func readState(path string) (State, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return State{}, err
	}
	return decode(data)
}

// writeState replaces the state file atomically.
func writeState(path string, st State) error {
	data, err := encode(st)
	if err != nil {
		return err
	}
	tmp, err := writeTemp(path, data)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("replace state: %w", err)
	}
	return nil
}

// writeTemp writes data to a new 0600 file beside path and returns its name.
func writeTemp(path string, data []byte) (string, error) {
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp-*")
	if err != nil {
		return "", fmt.Errorf("write state: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(f.Name())
		return "", fmt.Errorf("write state: %w", err)
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("write state: %w", err)
	}
	return f.Name(), nil
}
