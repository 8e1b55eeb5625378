// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package placement decides where an instance's memory goes on this host
// and whether it fits. It implements lifecycle.Placer on top of the pure
// ledger (core/ledger), the GPU inventory and host RAM (core/gpu), the
// role's memory settings and the measurements in the store:
//
//   - domains: one unified pool, or host RAM plus one domain per card, with
//     their limits (BuildDomains);
//   - sizing: declared resources, or charges derived from the driver's
//     memory hints, with the startup peak measured on an earlier start in
//     place of the estimate (ledger.Size);
//   - placement: the card with the most room that fits, pinned with
//     CUDA_VISIBLE_DEVICES=<uuid>; a start that fits nowhere is refused
//     capacity_blocked naming the host, the domain, the need, what is free
//     and the limit;
//   - measurement: while an instance starts, its processes' host RAM and
//     per-process GPU memory are sampled (compilers left out); when it is
//     ready the peak is stored, merged with MAX, keyed by deployment,
//     revision, host and engine digest.
//
// Memory the cards hold outside CapyCTL is read before each placement and
// comes out of the free reserve first.
package placement

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/capyctl/capyctl/core/config"
	"github.com/capyctl/capyctl/core/gpu"
	"github.com/capyctl/capyctl/core/ledger"
	"github.com/capyctl/capyctl/core/lifecycle"
	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk"
)

// Store is the part of the store the placer needs: measurements, and meta
// keys for the charges of running owners (so that a restarted role charges
// the engines it re-attaches to).
type Store interface {
	GetMeasurement(key string) (*store.Measurement, error)
	PutMeasurement(key string, m store.Measurement) error
	Meta(key string) (string, error)
	SetMeta(key, value string) error
}

// Config configures a Placer.
type Config struct {
	// Host is this machine's name (in refusals and measurement keys).
	Host string
	// GPU is the inventory; nil means no GPU.
	GPU gpu.Provider
	// HostFS reads host RAM and processes; zero means the running machine.
	HostFS gpu.HostFS
	// Memory holds the role's memory.* settings.
	Memory config.MemoryConfig
	Store  Store
	Logger hclog.Logger
	// SampleInterval is how often a starting engine's memory is sampled
	// (default 200ms).
	SampleInterval time.Duration
	// Now is the clock.
	Now func() time.Time
}

// Placer implements lifecycle.Placer.
type Placer struct {
	cfg    Config
	logger hclog.Logger

	mu      sync.Mutex
	l       *ledger.Ledger
	owners  map[string]*ownerInfo
	views   map[string]*deploymentView
	samples map[string]*sampler
	// launches are the processes of owners past their startup, to tell
	// CapyCTL's GPU memory from memory held outside it.
	launches map[string]launchIDs
}

// ownerInfo is what the placer knows of one charged instance.
type ownerInfo struct {
	Deployment string `json:"deployment"`
	Revision   uint64 `json:"revision"`
	// Card is the device domain the instance is pinned to ("" for none).
	Card  string                      `json:"card,omitempty"`
	Phase string                      `json:"phase"`
	Plan  map[string]map[string]int64 `json:"plan"`
	// Key is the measurement key of the instance's startup peak;
	// ParkedKey the one of its parked residue.
	Key       string `json:"measurement_key,omitempty"`
	ParkedKey string `json:"parked_measurement_key,omitempty"`
	// Declared sides of the startup are not replaced by measurements.
	DeviceDeclared bool `json:"device_declared,omitempty"`
	HostDeclared   bool `json:"host_declared,omitempty"`
}

// deploymentView is the last sizing of a deployment, for status.
type deploymentView struct {
	Revision uint64
	Sizing   ledger.Sizing
	Card     string
	Key      string
}

var (
	_ lifecycle.Placer       = (*Placer)(nil)
	_ lifecycle.ChargeReader = (*Placer)(nil)
	_ lifecycle.Forecaster   = (*Placer)(nil)
)

// New reads the inventory and host RAM, builds the domains and returns an
// empty placer (call Restore before the lifecycle recovers instances).
func New(cfg Config) (*Placer, error) {
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.GPU == nil {
		cfg.GPU = gpu.None{}
	}
	if cfg.HostFS.ProcRoot == "" {
		cfg.HostFS = gpu.DefaultHostFS
	}
	if cfg.SampleInterval <= 0 {
		cfg.SampleInterval = 200 * time.Millisecond
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	devs, err := cfg.GPU.Devices()
	if err != nil {
		return nil, structs.Wrap(structs.CodeInternal, err, "read the gpu inventory (%s)", cfg.GPU.Kind())
	}
	host, err := cfg.HostFS.ReadHostMemory()
	if err != nil {
		return nil, structs.Wrap(structs.CodeInternal, err, "read host memory")
	}
	domains, err := BuildDomains(devs, host, cfg.Memory)
	if err != nil {
		return nil, err
	}
	l, err := ledger.New(domains)
	if err != nil {
		return nil, structs.Wrap(structs.CodeInvalidConfig, err, "memory domains")
	}
	p := &Placer{
		cfg: cfg, logger: cfg.Logger.Named("placement"), l: l,
		owners: map[string]*ownerInfo{}, views: map[string]*deploymentView{}, samples: map[string]*sampler{},
		launches: map[string]launchIDs{},
	}
	p.mu.Lock()
	p.refreshExternal(devs)
	p.mu.Unlock()
	for _, d := range domains {
		p.logger.Info("memory domain", "domain", d.Name, "kind", d.Kind, "device", d.DeviceUUID,
			"capacity", structs.FormatBytes(d.Capacity), "managed_limit", structs.FormatBytes(d.ManagedLimit),
			"free_reserve", structs.FormatBytes(d.FreeReserve))
	}
	return p, nil
}

// Close stops every sampler.
func (p *Placer) Close() {
	p.mu.Lock()
	samplers := p.samples
	p.samples = map[string]*sampler{}
	p.mu.Unlock()
	for _, s := range samplers {
		s.halt()
	}
}

// Unified reports whether the host's GPU memory is one pool with host RAM
// (host_backed residency is refused there).
func (p *Placer) Unified() bool { return p.unified() }

// unified reports whether the host is one unified pool.
func (p *Placer) unified() bool {
	doms := p.l.Domains()
	return len(doms) == 1 && doms[0].Kind == ledger.KindUnified
}

// cards returns the device domains' indexes.
func (p *Placer) cards() []int {
	var out []int
	for i, d := range p.l.Domains() {
		if d.Kind == ledger.KindDevice {
			out = append(out, i)
		}
	}
	return out
}

// refreshExternal records, per card, what processes that are not CapyCTL's
// engines hold (the driver's own reservation counts too). Called with p.mu
// held.
func (p *Placer) refreshExternal(devs []gpu.Device) {
	if len(devs) == 0 {
		return
	}
	procs, err := p.cfg.GPU.Processes()
	if err != nil {
		p.logger.Warn("could not read per-process gpu memory", "error", err)
		return
	}
	mine := p.enginePIDs()
	ours := map[string]int64{}
	for _, pr := range procs {
		if mine[pr.PID] {
			ours[pr.DeviceUUID] += pr.Bytes
		}
	}
	for _, d := range p.l.Domains() {
		if d.Kind != ledger.KindDevice {
			continue
		}
		for _, dev := range devs {
			if dev.UUID == d.DeviceUUID {
				_ = p.l.SetExternal(d.Name, dev.UsedBytes-ours[dev.UUID])
			}
		}
	}
}

// enginePIDs returns the processes of every launch the placer tracks.
func (p *Placer) enginePIDs() map[int]bool {
	out := map[int]bool{}
	launches := p.pgids()
	if len(launches) == 0 {
		return out
	}
	table := p.cfg.HostFS.Processes()
	for _, g := range launches {
		engine, compilers := gpu.EngineProcesses(table, g.pgid, g.engine, g.shim)
		for _, pid := range append(engine, compilers...) {
			out[pid] = true
		}
	}
	return out
}

type launchIDs struct{ pgid, engine, shim int }

// pgids returns the launches the placer knows of (from samplers and from
// restored owners).
func (p *Placer) pgids() []launchIDs {
	var out []launchIDs
	for _, s := range p.samples {
		out = append(out, s.ids)
	}
	for _, ids := range p.launches {
		out = append(out, ids)
	}
	return out
}

// ---------------------------------------------------------------- sizing

// sizingInput gathers what ledger.Size needs for a deployment.
func (p *Placer) sizingInput(spec *structs.Deployment, hints *sdk.MemoryHints, residency string, measured *store.Measurement) ledger.SizingInput {
	in := ledger.SizingInput{Unified: p.unified(), Residency: residency}
	if in.Residency == "" {
		in.Residency = spec.Residency
	}
	if r := spec.Resources; r != nil {
		d := &ledger.Declared{GPU: int64(r.GPU), RAM: int64(r.RAM)}
		for name, ph := range r.Phases {
			if d.Phases == nil {
				d.Phases = map[string]ledger.Need{}
			}
			d.Phases[name] = ledger.Need{Device: int64(ph.GPU), Host: int64(ph.RAM)}
		}
		in.Declared = d
	}
	m := spec.EngineConfig.Memory
	in.Memory = ledger.MemorySpec{Request: int64(m.Request), KVCache: int64(m.KVCache), Startup: int64(m.Startup)}
	if hints != nil {
		in.Hints = ledger.Hints{
			WeightsBytes: hints.WeightsBytes, KVCacheBytes: hints.KVCacheBytes,
			ReadyDeviceBytes: hints.ReadyDeviceBytes, ReadyHostBytes: hints.ReadyHostBytes,
			StartupDeviceBytes: hints.StartupDeviceBytes, BesideHostBytes: hints.BesideHostBytes,
		}
	}
	if measured != nil {
		in.Measured = &ledger.Measured{DeviceBytes: measured.DeviceBytes, HostBytes: measured.HostBytes}
	}
	for _, d := range p.l.Domains() {
		if d.Kind == ledger.KindSystem {
			in.HostLimit = d.ManagedLimit
		}
	}
	return in
}

// plan turns a sizing into ledger charges: the host side in system and the
// card side in the chosen card's domain, or their sum in the unified pool.
func (p *Placer) plan(s ledger.Sizing, card string) (ledger.Plan, map[string]map[string]int64, error) {
	byName := func(n ledger.Need) map[string]int64 {
		if p.unified() {
			return map[string]int64{ledger.DomainUnified: n.Total()}
		}
		m := map[string]int64{ledger.DomainSystem: n.Host}
		if card != "" {
			m[card] = n.Device
		}
		return m
	}
	named := map[string]map[string]int64{
		ledger.PhaseStartup: byName(s.Startup),
		ledger.PhaseReady:   byName(s.Ready),
		ledger.PhaseParked:  byName(s.Parked),
	}
	if s.ParkedHost != (ledger.Need{}) && !p.unified() {
		named[ledger.PhaseParkedHost] = byName(s.ParkedHost)
	}
	pl, err := p.planFrom(named)
	if err != nil {
		return pl, nil, err
	}
	return pl, named, nil
}

// ParkedKey is the store key of a parked residue, keyed like
// MeasurementKey.
func ParkedKey(deployment string, revision uint64, host string, eng *structs.EngineRecord) string {
	return "parked/" + strings.TrimPrefix(MeasurementKey(deployment, revision, host, eng), "startup/")
}

// MeasurementKey is the store key of a startup peak: per deployment,
// revision, host and engine installation (its digest).
func MeasurementKey(deployment string, revision uint64, host string, eng *structs.EngineRecord) string {
	inst := ""
	if eng != nil {
		inst = eng.Digest
		if inst == "" {
			inst = eng.Name
		}
	}
	return fmt.Sprintf("startup/%s/%d/%s/%s", deployment, revision, host, inst)
}

func (p *Placer) measurement(key string) *store.Measurement {
	if p.cfg.Store == nil || key == "" {
		return nil
	}
	m, err := p.cfg.Store.GetMeasurement(key)
	if err != nil {
		return nil
	}
	return m
}

// ---------------------------------------------------------------- reserve

// Reserve admits an instance's startup phase on the card with the most room
// that fits it (or the unified pool), and pins it there.
func (p *Placer) Reserve(ctx context.Context, req lifecycle.Reservation) (*lifecycle.Grant, error) {
	return p.reserve(ctx, req, true)
}

// ReserveUnrecorded is Reserve without the charge record's write: the
// lifecycle writes it with the launch record (WithCharge), one synced
// write before the launch instead of two (lifecycle.ChargeRecorder).
func (p *Placer) ReserveUnrecorded(ctx context.Context, req lifecycle.Reservation) (*lifecycle.Grant, error) {
	return p.reserve(ctx, req, false)
}

// WithCharge calls put with the owner's charge record as it is now (the
// store meta values persist would write; none for an owner released or
// never charged), holding the placer's lock until put returns, so that no
// other write of that record comes between (lifecycle.ChargeRecorder).
func (p *Placer) WithCharge(owner string, put func(meta map[string]string) error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var meta map[string]string
	if info := p.owners[owner]; info != nil && p.cfg.Store != nil {
		data, _ := json.Marshal(info)
		meta = map[string]string{metaPrefix + owner: string(data)}
	}
	return put(meta)
}

// reserve is Reserve; record says whether it writes the charge record.
func (p *Placer) reserve(_ context.Context, req lifecycle.Reservation, record bool) (*lifecycle.Grant, error) {
	if req.Deployment == nil {
		return nil, structs.Errf(structs.CodeInternal, "reserve %s: no deployment", req.Owner)
	}
	key := MeasurementKey(req.Deployment.Name, req.Revision, p.cfg.Host, req.Engine)
	parkedKey := ParkedKey(req.Deployment.Name, req.Revision, p.cfg.Host, req.Engine)
	measured := p.measurement(key)
	measuredParked := p.measurement(parkedKey)
	devs, derr := p.cfg.GPU.Devices()

	p.mu.Lock()
	defer p.mu.Unlock()
	if derr != nil {
		p.logger.Warn("could not read the gpus before a placement", "error", derr)
	} else {
		p.refreshExternal(devs)
	}
	if s := p.samples[req.Owner]; s != nil {
		s.halt()
		delete(p.samples, req.Owner)
	}
	delete(p.launches, req.Owner)
	in := p.sizingInput(req.Deployment, req.Hints, req.Residency, measured)
	if measuredParked != nil {
		in.MeasuredParked = &ledger.Measured{DeviceBytes: measuredParked.DeviceBytes, HostBytes: measuredParked.HostBytes}
	}
	doms := p.l.Domains()

	// Candidates: the unified pool, or every card from the most room to
	// the least (ties by index), or none on a host without cards or for a
	// model that runs off the card (host RAM only, no card pinned).
	candidates := []string{""}
	hostOnly := false
	if !p.unified() {
		probe, err := ledger.Size(in)
		if err != nil {
			return nil, err
		}
		hostOnly = probe.HostOnly
	}
	if !p.unified() && !hostOnly {
		cards := p.cards()
		sort.SliceStable(cards, func(a, b int) bool {
			fa := doms[cards[a]].Room() - p.l.Charged(cards[a])
			fb := doms[cards[b]].Room() - p.l.Charged(cards[b])
			return fa > fb
		})
		if len(cards) > 0 {
			candidates = candidates[:0]
			for _, i := range cards {
				candidates = append(candidates, doms[i].Name)
			}
		}
	}
	var blocked *ledger.BlockedError
	for _, card := range candidates {
		in.DeviceLimit = 0
		for _, d := range doms {
			if (card != "" && d.Name == card) || d.Kind == ledger.KindUnified {
				in.DeviceLimit = d.ManagedLimit
			}
		}
		sz, err := ledger.Size(in)
		if err != nil {
			return nil, err
		}
		if card == "" && !p.unified() && sz.Startup.Device > 0 {
			return nil, structs.Errf(structs.CodeInsufficientDevice,
				"deployment %s needs %s of GPU memory and host %s has no GPU%s", req.Deployment.Name,
				structs.FormatBytes(sz.Startup.Device), p.cfg.Host, cpuHint(req.Engine))
		}
		plan, named, err := p.plan(sz, card)
		if err != nil {
			return nil, structs.Wrap(structs.CodeInternal, err, "plan the charges of %s", req.Owner)
		}
		_, err = p.l.Place(req.Owner, plan, ledger.PhaseStartup)
		if err != nil {
			if be, ok := err.(*ledger.BlockedError); ok {
				if blocked == nil {
					blocked = be
				}
				continue
			}
			return nil, structs.Wrap(structs.CodeInternal, err, "place %s", req.Owner)
		}
		info := &ownerInfo{
			Deployment: req.Deployment.Name, Revision: req.Revision, Card: card, Phase: ledger.PhaseStartup, Plan: named, Key: key, ParkedKey: parkedKey,
			DeviceDeclared: sz.StartupDeviceProvenance == ledger.ProvDeclared, HostDeclared: sz.StartupHostProvenance == ledger.ProvDeclared,
		}
		p.owners[req.Owner] = info
		p.views[req.Deployment.Name] = &deploymentView{Revision: req.Revision, Sizing: sz, Card: card, Key: key}
		if record {
			p.persist(req.Owner, info)
		}
		grant := &lifecycle.Grant{DeviceBytes: sz.Ready.Device, KVBytes: sz.KVCache}
		for _, d := range doms {
			if d.Name == card || d.Kind == ledger.KindUnified {
				grant.DeviceTotal = d.Capacity
				if d.DeviceUUID != "" {
					grant.DeviceUUIDs = []string{d.DeviceUUID}
				}
			}
		}
		if card != "" {
			grant.Env = map[string]string{"CUDA_VISIBLE_DEVICES": grant.DeviceUUIDs[0]}
		}
		p.logger.Info("placed", "instance", req.Owner, "domain", orUnified(card), "startup_device", structs.FormatBytes(sz.Startup.Device),
			"startup_host", structs.FormatBytes(sz.Startup.Host), "device_provenance", sz.StartupDeviceProvenance,
			"host_provenance", sz.StartupHostProvenance)
		return grant, nil
	}
	return nil, p.capacityBlocked(req.Deployment.Name, blocked)
}

func orUnified(card string) string {
	if card == "" {
		return "system/unified"
	}
	return card
}

// capacityBlocked renders a refusal naming the host, the domain, the need,
// what is free and the limit (SPEC D3).
func (p *Placer) capacityBlocked(dep string, be *ledger.BlockedError) error {
	if be == nil || len(be.Shortfalls) == 0 {
		return structs.Errf(structs.CodeCapacityBlocked, "deployment %s does not fit on host %s", dep, p.cfg.Host)
	}
	parts := make([]string, 0, len(be.Shortfalls))
	for _, s := range be.Shortfalls {
		parts = append(parts, s.String())
	}
	first := be.Shortfalls[0]
	e := structs.Errf(structs.CodeCapacityBlocked, "deployment %s does not fit on host %s: %s",
		dep, p.cfg.Host, strings.Join(parts, "; "))
	e.WithDetail("host", p.cfg.Host).
		WithDetail("domain", first.Domain).
		WithDetail("need_bytes", first.Need).
		WithDetail("free_bytes", first.Free).
		WithDetail("limit_bytes", first.Limit).
		WithDetail("shortfalls", be.Shortfalls)
	e.RetryAfter = 1
	return e
}

// ---------------------------------------------------------------- phases

// Phase moves an owner to a phase's charge. Reaching ready ends the startup
// measurement and stores its peak.
func (p *Placer) Phase(owner, phase string) error {
	record, err := p.PhaseThen(owner, phase)
	record()
	return err
}

// PhaseThen is Phase with its writes left to record
// (lifecycle.PhaseRecorder): the charge changes at once, in memory; record
// writes the owner's charge record (its current phase, whatever changed
// since) and, at ready, takes the startup measurement's last reading and
// stores its peak. record is never nil.
func (p *Placer) PhaseThen(owner, phase string) (record func(), err error) {
	p.mu.Lock()
	info := p.owners[owner]
	s := p.samples[owner]
	if s != nil && phase != ledger.PhaseStartup {
		delete(p.samples, owner)
		p.launches[owner] = s.ids
	}
	changed := false
	if info != nil {
		_, err = p.l.SetPhase(owner, phase)
		if err == nil {
			info.Phase = phase
			changed = true
		}
	}
	p.mu.Unlock()
	if s != nil {
		s.halt()
	}
	record = func() {
		if changed {
			p.mu.Lock()
			// A release meanwhile unpersisted the owner: nothing to write.
			if p.owners[owner] == info {
				p.persist(owner, info)
			}
			p.mu.Unlock()
		}
		if s != nil && info != nil && phase == ledger.PhaseReady {
			// One last reading at ready: a start shorter than the sampling
			// interval is still measured at least as it serves.
			s.record(p.sample(s.ids))
			p.storePeak(owner, info, s)
		}
	}
	if info == nil {
		return record, fmt.Errorf("phase %s: %w %q", phase, ledger.ErrUnknownOwner, owner)
	}
	if be, ok := err.(*ledger.BlockedError); ok {
		return record, p.capacityBlocked(info.Deployment, be)
	}
	if errors.Is(err, ledger.ErrNoPhase) {
		return record, structs.Wrap(structs.CodeCapacityBlocked, err, "deployment %s cannot keep its weights in host RAM here", info.Deployment)
	}
	return record, err
}

// Charges returns what an owner is charged now and in each phase, by
// domain (lifecycle.ChargeReader): a switch evicts only victims that free
// memory where the requester is short.
func (p *Placer) Charges(owner string) (now map[string]int64, plan map[string]map[string]int64, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st, ok := p.l.Owner(owner)
	if !ok {
		return nil, nil, false
	}
	return st.Charges, st.Plan, true
}

// Owner returns an owner's state in the ledger (its charges and phase).
func (p *Placer) Owner(owner string) (ledger.OwnerState, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.l.Owner(owner)
}

// FitsReady reports whether an owner's ready charge fits now beside what is
// charged (lifecycle.Forecaster): a charged owner (a parked one) by its own
// plan, an uncharged one by its deployment's last sizing on any card;
// known is false when neither is known.
func (p *Placer) FitsReady(owner, deployment string) (fits, known bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if st, ok := p.l.Owner(owner); ok {
		next, err := p.l.Charges(st.Plan[ledger.PhaseReady])
		if err != nil {
			return false, false
		}
		return p.l.Forecast(owner, next).Fits, true
	}
	v := p.views[deployment]
	if v == nil {
		return false, false
	}
	cards := []string{v.Card}
	if !p.unified() && v.Card != "" {
		cards = cards[:0]
		for _, i := range p.cards() {
			cards = append(cards, p.l.Domains()[i].Name)
		}
	}
	for _, card := range cards {
		pl, _, err := p.plan(v.Sizing, card)
		if err != nil {
			continue
		}
		if p.l.Forecast(owner, pl.Startup).Fits {
			return true, true
		}
	}
	return false, true
}

// Release drops an owner's charges (its processes are proven gone) and
// discards an unfinished measurement.
func (p *Placer) Release(owner string) {
	p.mu.Lock()
	s := p.samples[owner]
	delete(p.samples, owner)
	delete(p.launches, owner)
	p.l.Release(owner)
	_, had := p.owners[owner]
	delete(p.owners, owner)
	if had {
		p.unpersist(owner)
	}
	p.mu.Unlock()
	if s != nil {
		s.halt()
	}
}

// ---------------------------------------------------------------- persistence

const metaPrefix = "ledger/owner/"

// persist records an owner's plan and phase so that a restarted role
// charges the engine it re-attaches to. Called with p.mu held.
func (p *Placer) persist(owner string, info *ownerInfo) {
	if p.cfg.Store == nil {
		return
	}
	data, _ := json.Marshal(info)
	if err := p.cfg.Store.SetMeta(metaPrefix+owner, string(data)); err != nil {
		p.logger.Warn("could not record a charge", "instance", owner, "error", err)
	}
}

func (p *Placer) unpersist(owner string) {
	if p.cfg.Store == nil {
		return
	}
	// The store has no meta delete: an empty value means released.
	if err := p.cfg.Store.SetMeta(metaPrefix+owner, ""); err != nil {
		p.logger.Warn("could not record a release", "instance", owner, "error", err)
	}
}

// Restore charges the instances a previous run of the role left running:
// each instance record that may hold processes gets the charges recorded
// for it, without the admission check (its memory is in use whatever the
// limits say now). The lifecycle's recovery then releases what it proves
// gone.
func (p *Placer) Restore(records []structs.InstanceRecord) {
	if p.cfg.Store == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range records {
		if r.Launch == nil || r.State == structs.StateStopped || r.State == structs.StateFailed {
			continue
		}
		p.restoreOne(r, "")
	}
	// The restored engines' GPU memory is CapyCTL's, not memory held
	// outside it.
	p.refreshDevices()
}

// restoreOne charges one recorded instance from its recorded plan, in its
// recorded phase (or phase, when given), without the admission check.
// Called with p.mu held; it reports whether the owner is charged.
func (p *Placer) restoreOne(r structs.InstanceRecord, phase string) bool {
	owner := r.ID()
	if r.Launch != nil {
		p.restoreLaunch(owner, r.Launch)
	}
	if p.cfg.Store == nil {
		return false
	}
	raw, err := p.cfg.Store.Meta(metaPrefix + owner)
	if err != nil || raw == "" {
		p.logger.Warn("a recorded instance has no recorded charge; it is charged nothing until it restarts", "instance", owner)
		return false
	}
	var info ownerInfo
	if err := json.Unmarshal([]byte(raw), &info); err != nil {
		p.logger.Warn("a recorded charge does not parse", "instance", owner, "error", err)
		return false
	}
	pl, err := p.planFrom(info.Plan)
	if err != nil {
		p.logger.Warn("a recorded charge names a domain this host no longer has", "instance", owner, "error", err)
		return false
	}
	if phase != "" {
		info.Phase = phase
	}
	if err := p.l.Restore(owner, pl, info.Phase); err != nil {
		p.logger.Warn("could not restore a charge", "instance", owner, "error", err)
		return false
	}
	p.owners[owner] = &info
	p.persist(owner, &info)
	p.logger.Info("restored a charge", "instance", owner, "phase", info.Phase)
	return true
}

// planFrom turns charges by phase and domain name into a ledger plan.
func (p *Placer) planFrom(named map[string]map[string]int64) (ledger.Plan, error) {
	var pl ledger.Plan
	var err error
	if pl.Startup, err = p.l.Charges(named[ledger.PhaseStartup]); err != nil {
		return pl, err
	}
	if pl.Ready, err = p.l.Charges(named[ledger.PhaseReady]); err != nil {
		return pl, err
	}
	if pl.Parked, err = p.l.Charges(named[ledger.PhaseParked]); err != nil {
		return pl, err
	}
	if ph, ok := named[ledger.PhaseParkedHost]; ok {
		if pl.ParkedHost, err = p.l.Charges(ph); err != nil {
			return pl, err
		}
	}
	return pl, nil
}

// Adopt charges an instance the lifecycle re-attached to (after a role or
// driver restart) in the phase it really is in. An owner Restore already
// charged moves to that phase; a raise that no longer fits is charged
// anyway, since the memory is in use.
func (p *Placer) Adopt(owner, phase string, rec structs.InstanceRecord) {
	p.mu.Lock()
	defer p.mu.Unlock()
	info := p.owners[owner]
	if info == nil {
		p.restoreOne(rec, phase)
		p.refreshDevices()
		return
	}
	if rec.Launch != nil {
		p.restoreLaunch(owner, rec.Launch)
	}
	if info.Phase != phase {
		if _, err := p.l.SetPhase(owner, phase); err != nil {
			pl, perr := p.planFrom(info.Plan)
			if perr == nil {
				perr = p.l.Restore(owner, pl, phase)
			}
			if perr != nil {
				p.logger.Warn("could not adopt a re-attached instance's phase", "instance", owner, "phase", phase, "error", perr)
				return
			}
			p.logger.Warn("a re-attached instance is charged over the limit", "instance", owner, "phase", phase, "error", err)
		}
		info.Phase = phase
		p.persist(owner, info)
	}
	p.refreshDevices()
}

// restoreLaunch records a launch's processes (called with p.mu held).
func (p *Placer) restoreLaunch(owner string, l *structs.LaunchRecord) {
	ids := launchIDs{pgid: l.Pgid}
	for _, pr := range l.Processes {
		switch pr.Role {
		case "engine":
			ids.engine = pr.PID
		case "shim":
			ids.shim = pr.PID
		}
	}
	p.launches[owner] = ids
}

// refreshDevices reads the cards and records what they hold outside
// CapyCTL. Called with p.mu held.
func (p *Placer) refreshDevices() {
	devs, err := p.cfg.GPU.Devices()
	if err != nil {
		p.logger.Warn("could not read the gpus", "error", err)
		return
	}
	p.refreshExternal(devs)
}
