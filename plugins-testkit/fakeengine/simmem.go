// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/capyctl/capyctl/plugins-testkit/simgpu"
)

// Tags of the engine's allocations on the simulated GPU. The first two are
// also the tags of vLLM's wake_up and SGLang's memory occupation routes.
const (
	// TagWeights is the model weights.
	TagWeights = "weights"
	// TagKVCache is the KV cache.
	TagKVCache = "kv_cache"
	// TagStartupPeak is the transient memory of the startup (profiling,
	// graph capture), freed when the engine is ready.
	TagStartupPeak = "startup_peak"
	// TagParkResidue is what stays on the GPU while parked.
	TagParkResidue = "park_residue"
)

// SimConfig is the memory an engine holds on a simulated GPU. With an empty
// StatePath the engine holds nothing and Park and Wake only change phase.
type SimConfig struct {
	// StatePath is the simgpu state file.
	StatePath string
	// Visible is the CUDA_VISIBLE_DEVICES value that picks the device (an
	// index or a UUID; empty means index 0).
	Visible string
	// Weights is held from the start of loading until the engine stops
	// (released while parked).
	Weights int64
	// KV is held like Weights.
	KV int64
	// StartupPeak is held during loading only.
	StartupPeak int64
	// ParkResidue is held while parked.
	ParkResidue int64
	// StartCheck, when set, is asked once the device is open and before
	// anything is loaded, with the device's free and total bytes and its
	// index; an error fails the start (exit 1) with the error as the
	// engine's last log line, as vLLM's free-memory check does
	// (FactVLLMFreeMemory).
	StartCheck func(free, total int64, index int) error
}

// validate refuses negative sizes.
func (c SimConfig) validate() error {
	if c.Weights < 0 || c.KV < 0 || c.StartupPeak < 0 || c.ParkResidue < 0 {
		return errors.New("simulated gpu sizes must not be negative")
	}
	return nil
}

// simMemory is the engine's view of what it holds on the simulated GPU.
type simMemory struct {
	cfg SimConfig

	mu   sync.Mutex
	gpu  *simgpu.GPU
	dev  simgpu.Device
	held map[string]int64
}

// open opens the state file and resolves the device.
func (m *simMemory) open() error {
	g, err := simgpu.Open(m.cfg.StatePath)
	if err != nil {
		return err
	}
	st, err := g.Snapshot()
	if err != nil {
		return err
	}
	dev, err := simgpu.ResolveDevice(st, m.cfg.Visible)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.gpu, m.dev = g, dev
	m.mu.Unlock()
	return nil
}

// startCheck runs the configured StartCheck against the device's free
// memory now.
func (m *simMemory) startCheck() error {
	if m.cfg.StartCheck == nil {
		return nil
	}
	m.mu.Lock()
	g, dev := m.gpu, m.dev
	m.mu.Unlock()
	used, _, err := g.Usage(dev.UUID)
	if err != nil {
		return fmt.Errorf("simulated gpu: %w", err)
	}
	return m.cfg.StartCheck(dev.TotalBytes-used, dev.TotalBytes, dev.Index)
}

// enabled reports whether a simulated GPU is in use.
func (m *simMemory) enabled() bool { return m.cfg.StatePath != "" }

// alloc takes n bytes under tag; nothing when disabled or n is 0.
func (m *simMemory) alloc(tag string, n int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.gpu == nil || n == 0 {
		return nil
	}
	if err := m.gpu.Allocate(os.Getpid(), m.dev.UUID, tag, n); err != nil {
		return err
	}
	m.held[tag] += n
	return nil
}

// free releases everything held under tag.
func (m *simMemory) free(tag string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.gpu == nil || m.held[tag] == 0 {
		return nil
	}
	if err := m.gpu.Free(os.Getpid(), tag); err != nil {
		return err
	}
	delete(m.held, tag)
	return nil
}

// freeAll releases every tag the engine holds (only its own tags, so that
// other users of the same process keep theirs).
func (m *simMemory) freeAll() {
	m.mu.Lock()
	tags := slices.Collect(maps.Keys(m.held))
	m.mu.Unlock()
	for _, t := range tags {
		m.free(t)
	}
}

// snapshot copies what is held, nil when nothing.
func (m *simMemory) snapshot() map[string]int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.held) == 0 {
		return nil
	}
	return maps.Clone(m.held)
}

// loadSim takes the startup allocations: weights, the startup peak, then
// the KV cache, in the order an engine loads. An out-of-memory is logged
// the way PyTorch reports it and ends the engine with exit code 1.
func (e *Engine) loadSim() error {
	if !e.mem.enabled() {
		return nil
	}
	if err := e.mem.open(); err != nil {
		e.Logf(LevelError, "simulated gpu: %v", err)
		return &ExitError{Code: 1, Reason: fmt.Sprintf("simulated gpu: %v", err)}
	}
	e.Logf(LevelInfo, "using simulated device %d (%s)", e.mem.dev.Index, e.mem.dev.UUID)
	if err := e.mem.startCheck(); err != nil {
		e.Logf(LevelError, "%v", err)
		return &ExitError{Code: 1, Reason: err.Error()}
	}
	steps := []struct {
		tag string
		n   int64
	}{
		{TagWeights, e.cfg.Sim.Weights},
		{TagStartupPeak, e.cfg.Sim.StartupPeak},
		{TagKVCache, e.cfg.Sim.KV},
	}
	for _, s := range steps {
		if err := e.mem.alloc(s.tag, s.n); err != nil {
			e.logOOM(err)
			e.mem.freeAll()
			return &ExitError{Code: 1, Reason: fmt.Sprintf("allocate %s: %v", s.tag, err)}
		}
		if s.n > 0 {
			e.Logf(LevelInfo, "allocated %s for %s", FormatBytes(s.n), s.tag)
		}
	}
	return nil
}

// logOOM writes a CUDA-like out-of-memory line (or the plain error).
func (e *Engine) logOOM(err error) {
	var oom *simgpu.OutOfMemoryError
	if !errors.As(err, &oom) {
		e.Logf(LevelError, "simulated gpu: %v", err)
		return
	}
	e.mem.mu.Lock()
	var mine int64
	for _, n := range e.mem.held {
		mine += n
	}
	e.mem.mu.Unlock()
	e.writeLog(LevelError, fmt.Sprintf(
		"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate %s. GPU %d has a total capacity of %s of which %s is free. This process has %s memory in use.",
		gibString(oom.Requested), oom.Device.Index, gibString(oom.Device.TotalBytes), gibString(oom.Free()), gibString(mine)))
}

// Park releases memory from the simulated GPU: the given tags (TagWeights,
// TagKVCache; both when none are given, as vLLM's sleep does, while SGLang
// may release one). The first Park of a cycle takes the park residue and
// pauses the slot queue: new requests wait (counted as waiting) until Wake.
// Parking a parked engine releases what is still held and keeps the
// deepest level. level is recorded for the flavour (vLLM's 1 or 2); the
// GPU memory freed is the same. Requests already generating are not
// touched: a flavour that aborts or drains them first uses AbortAll.
//
// The head of a group first has every worker release the same tags on
// its own card ("sleep" in group.go); a worker that fails or is gone fails
// the park before the head changes anything of its own.
func (e *Engine) Park(level int, tags ...string) error {
	e.parkMu.Lock()
	defer e.parkMu.Unlock()
	tags, err := memoryTags("park", tags)
	if err != nil {
		return err
	}
	if p := e.Phase(); p != PhaseReady && p != PhaseParked {
		return fmt.Errorf("park: engine is %s", p)
	}
	if err := e.groupCall(fmt.Sprintf("sleep %d %s", level, strings.Join(tags, " ")), "slept"); err != nil {
		return fmt.Errorf("park: %w", err)
	}
	first := false
	switch e.Phase() {
	case PhaseReady:
		e.slots.setPaused(true)
		first = true
	case PhaseParked:
		e.parkLevel = max(e.parkLevel, level)
	default:
		return fmt.Errorf("park: engine is %s", e.Phase())
	}
	for _, tag := range tags {
		if e.parked[tag] {
			continue
		}
		if err := e.mem.free(tag); err != nil {
			return fmt.Errorf("park: %w", err)
		}
		e.parked[tag] = true
	}
	if first {
		// The residue is what the engine keeps of what it released (its
		// CUDA context, graphs, allocator caches): taken once the tags
		// are free, so that it may be as large as they were.
		e.parkLevel = level
		e.phase.Store(int32(PhaseParked))
		e.parks.Add(1)
		if err := e.mem.alloc(TagParkResidue, e.cfg.Sim.ParkResidue); err != nil {
			// Only another process taking the freed memory first can
			// cause it (a simulation's race): the engine is parked,
			// and the park reported failed.
			e.logOOM(err)
			return fmt.Errorf("park: %w", err)
		}
	}
	e.Logf(LevelInfo, "parked (level %d): released %v", e.parkLevel, tags)
	return nil
}

// groupCall carries cmd out on every worker of the head's group (see
// group.go's protocol); nil at once without a group.
func (e *Engine) groupCall(cmd, want string) error {
	g := e.group.Load()
	if g == nil {
		return nil
	}
	if e.groupStuck() {
		// vLLM runs sleep, wake_up and reload_weights as a collective RPC
		// with no timeout: it waits for the lost rank until the engine is
		// stopped.
		<-e.life.Done()
		return fmt.Errorf("%s: %w", cmd, errShutdown)
	}
	if err := g.call(cmd, want); err != nil {
		if errors.Is(err, errGroupRankLost) && e.cfg.Group.PeerLoss == PeerLossHang {
			<-e.life.Done()
			return fmt.Errorf("%s: %w", cmd, errShutdown)
		}
		e.Logf(LevelError, "%v", err)
		return err
	}
	return nil
}

// memoryTags checks tags for Park and Wake; none means both.
func memoryTags(op string, tags []string) ([]string, error) {
	if len(tags) == 0 {
		return []string{TagWeights, TagKVCache}, nil
	}
	for _, t := range tags {
		if t != TagWeights && t != TagKVCache {
			return nil, fmt.Errorf("%s: unknown tag %q (want %q or %q)", op, t, TagWeights, TagKVCache)
		}
	}
	return tags, nil
}

// Wake re-allocates what Park released: the given tags (TagWeights,
// TagKVCache), or both when none are given. When nothing is left released
// the residue is freed, the engine is ready again and waiting requests
// start. An out-of-memory is returned (it wraps simgpu.ErrOutOfMemory) and
// leaves the engine parked. Waking a ready engine does nothing.
//
// The head of a group first has every worker take the same tags back on
// its own card ("wake" in group.go); a worker that fails or is gone fails
// the wake and leaves the head parked.
func (e *Engine) Wake(tags ...string) error {
	e.parkMu.Lock()
	defer e.parkMu.Unlock()
	tags, err := memoryTags("wake", tags)
	if err != nil {
		return err
	}
	if e.Phase() != PhaseParked {
		return nil
	}
	if err := e.groupCall("wake "+strings.Join(tags, " "), "woke"); err != nil {
		return fmt.Errorf("wake: %w", err)
	}
	sizes := map[string]int64{TagWeights: e.cfg.Sim.Weights, TagKVCache: e.cfg.Sim.KV}
	for _, t := range tags {
		if !e.parked[t] {
			continue
		}
		if err := e.mem.alloc(t, sizes[t]); err != nil {
			e.logOOM(err)
			return fmt.Errorf("wake %s: %w", t, err)
		}
		delete(e.parked, t)
	}
	if len(e.parked) > 0 {
		return nil
	}
	if err := e.mem.free(TagParkResidue); err != nil {
		return fmt.Errorf("wake: %w", err)
	}
	e.parkLevel = 0
	e.phase.Store(int32(PhaseReady))
	e.wakes.Add(1)
	e.slots.setPaused(false)
	e.Logf(LevelInfo, "awake")
	return nil
}
