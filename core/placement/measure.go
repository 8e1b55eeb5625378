// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package placement

import (
	"sync"
	"time"

	"github.com/capyctl/capyctl/core/gpu"
	"github.com/capyctl/capyctl/core/ledger"
	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
)

// Launched starts measuring a start's peak from the engine's own processes
// (the launch's process group and the engine's descendants, without the
// shim and without compilers): host RAM from /proc and GPU memory per
// process from the provider, card and host apart. It implements
// lifecycle.ProcessObserver.
func (p *Placer) Launched(owner string, pgid int, procs []structs.ProcessIdentity) {
	ids := launchIDs{pgid: pgid}
	for _, pr := range procs {
		switch pr.Role {
		case "engine":
			ids.engine = pr.PID
		case "shim":
			ids.shim = pr.PID
		}
	}
	if ids.engine == 0 && ids.pgid == 0 {
		return
	}
	p.mu.Lock()
	if p.owners[owner] == nil {
		p.mu.Unlock()
		return
	}
	old := p.samples[owner]
	s := newSampler(ids)
	p.samples[owner] = s
	p.mu.Unlock()
	if old != nil {
		old.halt()
	}
	go s.run(p.sample, p.cfg.SampleInterval)
}

// sample reads what a launch's processes hold now: host RAM (VmRSS summed)
// and GPU memory (per process, every card). ok is false when no process of
// the launch is left.
func (p *Placer) sample(ids launchIDs) (device, host int64, ok bool) {
	table := p.cfg.HostFS.Processes()
	engine, _ := gpu.EngineProcesses(table, ids.pgid, ids.engine, ids.shim)
	if len(engine) == 0 {
		return 0, 0, false
	}
	mine := make(map[int]bool, len(engine))
	for _, pid := range engine {
		mine[pid] = true
		if rss, err := p.cfg.HostFS.ResidentBytes(pid); err == nil {
			host += rss
		}
	}
	procs, err := p.cfg.GPU.Processes()
	if err != nil {
		p.logger.Debug("could not read per-process gpu memory", "error", err)
	}
	for _, pr := range procs {
		if mine[pr.PID] {
			device += pr.Bytes
		}
	}
	return device, host, true
}

// storePeak merges a finished start's peak into the stored measurement
// (MAX of each side) so later starts reserve it instead of the estimate.
func (p *Placer) storePeak(owner string, info *ownerInfo, s *sampler) {
	dev, host, n := s.peak()
	if n == 0 || (dev == 0 && host == 0) || p.cfg.Store == nil || info.Key == "" {
		return
	}
	m := store.Measurement{Provenance: ledger.ProvMeasured, At: p.cfg.Now().UTC()}
	if old, err := p.cfg.Store.GetMeasurement(info.Key); err == nil && old != nil {
		m.DeviceBytes, m.HostBytes, m.Samples = old.DeviceBytes, old.HostBytes, old.Samples
	}
	m.DeviceBytes = max(m.DeviceBytes, dev)
	m.HostBytes = max(m.HostBytes, host)
	m.Samples += n
	if err := p.cfg.Store.PutMeasurement(info.Key, m); err != nil {
		p.logger.Warn("could not store a startup measurement", "instance", owner, "error", err)
		return
	}
	p.logger.Info("startup peak measured", "instance", owner, "key", info.Key,
		"device", structs.FormatBytes(dev), "host", structs.FormatBytes(host), "samples", n,
		"stored_device", structs.FormatBytes(m.DeviceBytes), "stored_host", structs.FormatBytes(m.HostBytes))
}

// sampler polls one start's memory until halted and keeps the peaks.
type sampler struct {
	ids  launchIDs
	stop chan struct{}
	done chan struct{}
	once sync.Once

	mu         sync.Mutex
	peakDevice int64
	peakHost   int64
	samples    int
}

func newSampler(ids launchIDs) *sampler {
	return &sampler{ids: ids, stop: make(chan struct{}), done: make(chan struct{})}
}

// run samples at once, then every interval, until halt.
func (s *sampler) run(sample func(launchIDs) (int64, int64, bool), interval time.Duration) {
	defer close(s.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		s.record(sample(s.ids))
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
	}
}

// record merges one reading into the peaks (ok false: no process left).
func (s *sampler) record(dev, host int64, ok bool) {
	if !ok {
		return
	}
	s.mu.Lock()
	s.peakDevice = max(s.peakDevice, dev)
	s.peakHost = max(s.peakHost, host)
	s.samples++
	s.mu.Unlock()
}

// halt stops the sampler and waits for it.
func (s *sampler) halt() {
	s.once.Do(func() { close(s.stop) })
	<-s.done
}

// peak returns the peaks so far and the number of samples.
func (s *sampler) peak() (device, host int64, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peakDevice, s.peakHost, s.samples
}

// Parked measures what a parked engine still holds (its residue) from its
// own processes, stores it (merged with MAX) for the next parks of the
// revision, and charges it now on the card: never below the placeholder
// nor above the ready charge (SPEC D2). The lifecycle calls it once an
// instance is parked.
func (p *Placer) Parked(owner string) {
	p.mu.Lock()
	info := p.owners[owner]
	ids, ok := p.launches[owner]
	p.mu.Unlock()
	if info == nil || !ok {
		return
	}
	dev, host, alive := p.sample(ids)
	if !alive {
		return
	}
	if p.cfg.Store != nil && info.ParkedKey != "" && dev > 0 {
		m := store.Measurement{Provenance: ledger.ProvMeasured, At: p.cfg.Now().UTC()}
		if old, err := p.cfg.Store.GetMeasurement(info.ParkedKey); err == nil && old != nil {
			m.DeviceBytes, m.HostBytes, m.Samples = old.DeviceBytes, old.HostBytes, old.Samples
		}
		m.DeviceBytes = max(m.DeviceBytes, dev)
		m.HostBytes = max(m.HostBytes, host)
		m.Samples++
		if err := p.cfg.Store.PutMeasurement(info.ParkedKey, m); err != nil {
			p.logger.Warn("could not store a parked residue", "instance", owner, "error", err)
		}
	}
	if info.Card == "" || dev <= 0 {
		return // a unified pool or nothing measured: the next sizing uses it
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.owners[owner] != info {
		return
	}
	charge := ledger.ParkedResidue(dev, false, info.Plan[ledger.PhaseReady][info.Card])
	if info.Plan[ledger.PhaseParked][info.Card] == charge && (info.Plan[ledger.PhaseParkedHost] == nil || info.Plan[ledger.PhaseParkedHost][info.Card] == charge) {
		return
	}
	named := map[string]map[string]int64{}
	for ph, byDomain := range info.Plan {
		named[ph] = map[string]int64{}
		for d, b := range byDomain {
			named[ph][d] = b
		}
	}
	named[ledger.PhaseParked][info.Card] = charge
	if named[ledger.PhaseParkedHost] != nil {
		// Both parks leave the same residue on the card.
		named[ledger.PhaseParkedHost][info.Card] = charge
	}
	pl, err := p.planFrom(named)
	if err == nil {
		_, err = p.l.Place(owner, pl, info.Phase)
	}
	if err != nil {
		p.logger.Warn("a measured parked residue does not fit; the placeholder stays charged", "instance", owner,
			"residue", structs.FormatBytes(dev), "error", err)
		return
	}
	info.Plan = named
	p.persist(owner, info)
	if v := p.views[info.Deployment]; v != nil {
		v.Sizing.Parked.Device = charge
		if v.Sizing.ParkedHost != (ledger.Need{}) {
			v.Sizing.ParkedHost.Device = charge
		}
		v.Sizing.ParkedProvenance = ledger.ProvMeasured
	}
	p.logger.Info("parked residue measured", "instance", owner, "residue", structs.FormatBytes(dev), "charged", structs.FormatBytes(charge))
}

// DeviceHeld returns the device memory an owner's launch holds now, from
// its own processes, and its ready charge on its card
// (lifecycle.ReleaseProver); ok is false when it has no launch or nothing
// could be read.
func (p *Placer) DeviceHeld(owner string) (held, ready int64, ok bool) {
	p.mu.Lock()
	ids, launched := p.launches[owner]
	if info := p.owners[owner]; info != nil && info.Card != "" {
		ready = info.Plan[ledger.PhaseReady][info.Card]
	}
	p.mu.Unlock()
	if !launched {
		return 0, ready, false
	}
	dev, _, alive := p.sample(ids)
	return dev, ready, alive
}
