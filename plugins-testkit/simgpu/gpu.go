// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package simgpu

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"syscall"
)

// Sentinel errors; the errors returned wrap them.
var (
	// ErrOutOfMemory is a refused allocation, like a CUDA out-of-memory
	// error. Returned errors are *OutOfMemoryError, which carry the figures.
	ErrOutOfMemory = errors.New("out of memory")
	// ErrNoDevice is an unknown device UUID or CUDA_VISIBLE_DEVICES value.
	ErrNoDevice = errors.New("no such device")
	// ErrNoProcess is an allocation for a process that does not run.
	ErrNoProcess = errors.New("no such process")
)

// OutOfMemoryError is a refused allocation with the device's figures at the
// moment of the refusal. It matches ErrOutOfMemory with errors.Is.
type OutOfMemoryError struct {
	// Device is the device that was full.
	Device Device
	// PID is the process that asked.
	PID int
	// Requested is the size asked for.
	Requested int64
	// Used is what all processes held on the device before the request.
	Used int64
}

// Free is what the device had left before the request.
func (e *OutOfMemoryError) Free() int64 { return e.Device.TotalBytes - e.Used }

// Error reports the figures in bytes.
func (e *OutOfMemoryError) Error() string {
	return fmt.Sprintf("out of memory on device %d (%s): pid %d tried to allocate %d bytes, %d of %d bytes in use, %d free",
		e.Device.Index, e.Device.UUID, e.PID, e.Requested, e.Used, e.Device.TotalBytes, e.Free())
}

// Unwrap makes errors.Is(err, ErrOutOfMemory) true.
func (e *OutOfMemoryError) Unwrap() error { return ErrOutOfMemory }

// GPU is a handle on a state file. It holds no open file between calls, so
// it is safe for concurrent use by goroutines and by several processes.
type GPU struct {
	path string
}

// Open returns a handle on the state file at path, which Create wrote.
func Open(path string) (*GPU, error) {
	if _, err := readState(path); err != nil {
		return nil, fmt.Errorf("open simulated gpu %s: %w", path, err)
	}
	return &GPU{path: path}, nil
}

// Path is the state file's path.
func (g *GPU) Path() string { return g.path }

// Allocate adds bytes to what pid holds on the device under tag (a second
// allocation with the same tag grows the first). Like a CUDA allocation it
// fails, with an *OutOfMemoryError, when the device's used bytes plus bytes
// would exceed its total. Entries of dead processes are dropped first, as
// the driver of a real card frees them.
func (g *GPU) Allocate(pid int, deviceUUID, tag string, bytes int64) error {
	if bytes < 0 {
		return fmt.Errorf("allocate %d bytes: negative size", bytes)
	}
	ticks, state, err := procStat(pid)
	if err != nil || isDead(state) {
		return fmt.Errorf("allocate for pid %d: %w", pid, ErrNoProcess)
	}
	err = g.update(func(st *State) (bool, error) {
		changed := prune(st)
		dev, ok := findDevice(*st, deviceUUID)
		if !ok {
			return changed, fmt.Errorf("allocate on %s: %w", deviceUUID, ErrNoDevice)
		}
		if bytes == 0 {
			return changed, nil
		}
		used := usedOn(*st, deviceUUID)
		if used+bytes > dev.TotalBytes {
			return changed, &OutOfMemoryError{Device: dev, PID: pid, Requested: bytes, Used: used}
		}
		for i := range st.Allocations {
			a := &st.Allocations[i]
			if a.PID == pid && a.StartTicks == ticks && a.DeviceUUID == deviceUUID && a.Tag == tag {
				a.Bytes += bytes
				return true, nil
			}
		}
		st.Allocations = append(st.Allocations, Allocation{
			PID: pid, StartTicks: ticks, DeviceUUID: deviceUUID, Tag: tag, Bytes: bytes,
		})
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("simulated gpu %s: %w", g.path, err)
	}
	return nil
}

// Free releases what pid holds under tag on every device; tag "" releases
// everything pid holds. Freeing nothing is not an error.
func (g *GPU) Free(pid int, tag string) error {
	err := g.update(func(st *State) (bool, error) {
		changed := prune(st)
		n := len(st.Allocations)
		st.Allocations = slices.DeleteFunc(st.Allocations, func(a Allocation) bool {
			return a.PID == pid && (tag == "" || a.Tag == tag)
		})
		return changed || len(st.Allocations) != n, nil
	})
	if err != nil {
		return fmt.Errorf("simulated gpu %s: free pid %d tag %q: %w", g.path, pid, tag, err)
	}
	return nil
}

// Snapshot returns the devices and the allocations of live processes. The
// entries of dead processes, and of PIDs whose start time changed (reused by
// another process), vanish as on a real card, and the cleanup is persisted.
func (g *GPU) Snapshot() (State, error) {
	var out State
	err := g.update(func(st *State) (bool, error) {
		changed := prune(st)
		out = State{
			Devices:     slices.Clone(st.Devices),
			Allocations: slices.Clone(st.Allocations),
		}
		return changed, nil
	})
	if err != nil {
		return State{}, fmt.Errorf("simulated gpu %s: snapshot: %w", g.path, err)
	}
	return out, nil
}

// Usage returns the bytes in use on a device, in total and per process
// (all tags summed), after dropping the entries of dead processes.
func (g *GPU) Usage(deviceUUID string) (used int64, perProcess map[int]int64, err error) {
	st, err := g.Snapshot()
	if err != nil {
		return 0, nil, err
	}
	if _, ok := findDevice(st, deviceUUID); !ok {
		return 0, nil, fmt.Errorf("simulated gpu %s: usage of %s: %w", g.path, deviceUUID, ErrNoDevice)
	}
	perProcess = map[int]int64{}
	for _, a := range st.Allocations {
		if a.DeviceUUID == deviceUUID {
			used += a.Bytes
			perProcess[a.PID] += a.Bytes
		}
	}
	return used, perProcess, nil
}

// update runs fn on the state under the exclusive lock and writes the state
// back when fn reports a change (also when fn fails after changing it, so a
// cleanup is never lost).
func (g *GPU) update(fn func(st *State) (changed bool, err error)) error {
	lock, err := os.OpenFile(g.path+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("open lock: %w", err)
	}
	defer lock.Close() // closing the descriptor releases the flock
	if err := flock(lock); err != nil {
		return err
	}
	st, err := readState(g.path)
	if err != nil {
		return err
	}
	changed, fnErr := fn(&st)
	if changed {
		if err := writeState(g.path, st); err != nil {
			return err
		}
	}
	return fnErr
}

// flock takes an exclusive lock on f, retrying when a signal interrupts.
func flock(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EINTR) {
			return fmt.Errorf("lock: %w", err)
		}
	}
}

// prune drops the allocations of dead or reused PIDs and reports a change.
func prune(st *State) bool {
	live := map[int]uint64{} // pid → start ticks, for the PIDs checked
	dead := map[int]bool{}
	n := len(st.Allocations)
	st.Allocations = slices.DeleteFunc(st.Allocations, func(a Allocation) bool {
		if dead[a.PID] {
			return true
		}
		ticks, ok := live[a.PID]
		if !ok {
			t, state, err := procStat(a.PID)
			if err != nil || isDead(state) {
				dead[a.PID] = true
				return true
			}
			live[a.PID] = t
			ticks = t
		}
		return ticks != a.StartTicks
	})
	return len(st.Allocations) != n
}

// findDevice looks a device up by UUID.
func findDevice(st State, uuid string) (Device, bool) {
	for _, d := range st.Devices {
		if d.UUID == uuid {
			return d, true
		}
	}
	return Device{}, false
}

// usedOn sums the allocations on a device.
func usedOn(st State, uuid string) int64 {
	var used int64
	for _, a := range st.Allocations {
		if a.DeviceUUID == uuid {
			used += a.Bytes
		}
	}
	return used
}
