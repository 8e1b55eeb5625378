// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package ledger

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
)

// Phases of an owner. An owner's charge is the one of its phase; stopped
// is always zero.
const (
	PhaseStartup = "startup"
	PhaseReady   = "ready"
	PhaseParked  = "parked"
	// PhaseParkedHost is parked with the weights kept in host RAM (vLLM's
	// sleep level 1, the host_backed tier): the parked charge plus the
	// host copy of the weights. A park takes it when the host has room for
	// it, else PhaseParked (weights dropped, level 2).
	PhaseParkedHost = "parked_host"
	PhaseStopped    = "stopped"
)

// Phases lists the phases in the order an instance lives them.
var Phases = []string{PhaseStartup, PhaseReady, PhaseParked, PhaseParkedHost, PhaseStopped}

// Errors callers may test with errors.Is.
var (
	// ErrUnknownOwner is a phase change or forecast for an owner the ledger
	// does not hold.
	ErrUnknownOwner = errors.New("unknown owner")
	// ErrUnknownPhase is a phase outside Phases.
	ErrUnknownPhase = errors.New("unknown phase")
	// ErrUnknownDomain is a charge in a domain the ledger does not have.
	ErrUnknownDomain = errors.New("unknown domain")
	// ErrBadCharge is a negative charge or a vector of the wrong length.
	ErrBadCharge = errors.New("bad charge")
	// ErrNoPhase is a phase the owner's plan does not have (parked_host
	// for a model that cannot keep its weights in host RAM).
	ErrNoPhase = errors.New("the plan has no phase")
)

// Charges is a charge in bytes per domain, indexed like Ledger.Domains.
// A nil Charges is zero everywhere.
type Charges []int64

// Plan is an owner's charge in each phase (stopped is zero).
type Plan struct {
	Startup Charges
	Ready   Charges
	Parked  Charges
	// ParkedHost is nil for an owner that cannot park with its weights in
	// host RAM (a unified pool, a model that does not park): the phase is
	// then refused (ErrNoPhase).
	ParkedHost Charges
}

// For returns the charges of a phase.
func (p Plan) For(phase string) (Charges, error) {
	switch phase {
	case PhaseStartup:
		return p.Startup, nil
	case PhaseReady:
		return p.Ready, nil
	case PhaseParked:
		return p.Parked, nil
	case PhaseParkedHost:
		if p.ParkedHost == nil {
			return nil, fmt.Errorf("%w %q", ErrNoPhase, phase)
		}
		return p.ParkedHost, nil
	case PhaseStopped:
		return nil, nil
	}
	return nil, fmt.Errorf("%w %q", ErrUnknownPhase, phase)
}

// Ledger is one host's domains and the owners charged in them.
type Ledger struct {
	domains []Domain
	index   map[string]int
	owners  map[string]*owner
	// charged[d] is the sum of every owner's current charge in domain d.
	charged []int64
	// epoch counts the committed changes (charges and observations).
	epoch uint64
}

// owner is one instance in the ledger.
type owner struct {
	phase string
	plan  Plan
	cur   Charges
}

// New returns an empty ledger over domains, refusing limits that do not
// fit together and duplicate names.
func New(domains []Domain) (*Ledger, error) {
	if len(domains) == 0 {
		return nil, errors.New("a ledger needs at least one domain")
	}
	l := &Ledger{
		domains: append([]Domain(nil), domains...),
		index:   make(map[string]int, len(domains)),
		owners:  map[string]*owner{},
		charged: make([]int64, len(domains)),
	}
	for i, d := range l.domains {
		if err := d.Validate(); err != nil {
			return nil, err
		}
		if _, dup := l.index[d.Name]; dup {
			return nil, fmt.Errorf("domain %s appears twice", d.Name)
		}
		l.index[d.Name] = i
	}
	return l, nil
}

// Domains returns a copy of the domains, in index order.
func (l *Ledger) Domains() []Domain { return append([]Domain(nil), l.domains...) }

// Index returns the index of a domain by name.
func (l *Ledger) Index(name string) (int, bool) {
	i, ok := l.index[name]
	return i, ok
}

// Epoch counts committed changes; two snapshots with the same epoch agree.
func (l *Ledger) Epoch() uint64 { return l.epoch }

// Charges turns a charge by domain name into a vector; zero entries may be
// left out.
func (l *Ledger) Charges(byName map[string]int64) (Charges, error) {
	c := make(Charges, len(l.domains))
	for name, b := range byName {
		i, ok := l.index[name]
		if !ok {
			if b == 0 {
				continue
			}
			return nil, fmt.Errorf("%w %q", ErrUnknownDomain, name)
		}
		if b < 0 {
			return nil, fmt.Errorf("%w: %s in %s is negative", ErrBadCharge, formatBytes(b), name)
		}
		c[i] = b
	}
	return c, nil
}

// ByName turns a vector into a charge by domain name, leaving zeros out.
func (l *Ledger) ByName(c Charges) map[string]int64 {
	out := map[string]int64{}
	for i, b := range c {
		if b != 0 && i < len(l.domains) {
			out[l.domains[i].Name] = b
		}
	}
	return out
}

// SetExternal records what a domain holds outside CapyCTL (an observation;
// it narrows the room of later admissions and never un-charges anyone).
func (l *Ledger) SetExternal(name string, bytes int64) error {
	i, ok := l.index[name]
	if !ok {
		return fmt.Errorf("%w %q", ErrUnknownDomain, name)
	}
	if bytes < 0 {
		bytes = 0
	}
	if l.domains[i].External != bytes {
		l.domains[i].External = bytes
		l.epoch++
	}
	return nil
}

// checkCharges refuses a vector of the wrong length or with a negative entry.
func (l *Ledger) checkCharges(c Charges) error {
	if c == nil {
		return nil
	}
	if len(c) != len(l.domains) {
		return fmt.Errorf("%w: %d entries for %d domains", ErrBadCharge, len(c), len(l.domains))
	}
	for i, b := range c {
		if b < 0 {
			return fmt.Errorf("%w: %s in %s is negative", ErrBadCharge, formatBytes(b), l.domains[i].Name)
		}
	}
	return nil
}

func (p Plan) check(l *Ledger) error {
	for _, c := range []Charges{p.Startup, p.Ready, p.Parked, p.ParkedHost} {
		if err := l.checkCharges(c); err != nil {
			return err
		}
	}
	return nil
}

func at(c Charges, i int) int64 {
	if c == nil {
		return 0
	}
	return c[i]
}

// Forecast says whether the owner's charges could become next (its current
// ones replaced; a new owner holds nothing). It never changes the ledger
// and allocates only when something is blocked.
func (l *Ledger) Forecast(ownerID string, next Charges) Forecast {
	var cur Charges
	if o := l.owners[ownerID]; o != nil {
		cur = o.cur
	}
	return l.forecast(cur, next)
}

func (l *Ledger) forecast(cur, next Charges) Forecast {
	f := Forecast{Fits: true}
	for i := range l.domains {
		n, c := at(next, i), at(cur, i)
		if n <= c {
			continue // a change that lowers (or keeps) a charge is always admitted
		}
		others := l.charged[i] - c
		after, ok := addChecked(others, n)
		room := l.domains[i].Room()
		if ok && after <= room {
			continue
		}
		f.Fits = false
		f.Blocked = append(f.Blocked, l.shortfall(i, n, others, ok))
	}
	return f
}

func (l *Ledger) shortfall(i int, need, others int64, ok bool) Shortfall {
	d := l.domains[i]
	room := d.Room()
	free := room - others
	if free < 0 {
		free = 0
	}
	short := int64(math.MaxInt64)
	if ok {
		short = need - free
	}
	return Shortfall{
		Domain: d.Name, Kind: d.Kind, DeviceUUID: d.DeviceUUID,
		Need: need, Free: free, Limit: d.ManagedLimit, Room: room,
		Capacity: d.Capacity, Reserve: d.FreeReserve, External: d.External,
		Charged: others, Short: short,
	}
}

// ForecastPlace is Place without the change.
func (l *Ledger) ForecastPlace(ownerID string, plan Plan, phase string) (Forecast, error) {
	if err := plan.check(l); err != nil {
		return Forecast{}, err
	}
	next, err := plan.For(phase)
	if err != nil {
		return Forecast{}, err
	}
	return l.Forecast(ownerID, next), nil
}

// Place admits an owner in a phase with a plan (a new owner, or one whose
// plan changes: a new launch). When it does not fit, nothing changes and
// the error is a *BlockedError with the figures.
func (l *Ledger) Place(ownerID string, plan Plan, phase string) (Forecast, error) {
	f, err := l.ForecastPlace(ownerID, plan, phase)
	if err != nil {
		return f, err
	}
	if !f.Fits {
		return f, &BlockedError{Owner: ownerID, Phase: phase, Shortfalls: f.Blocked}
	}
	next, _ := plan.For(phase)
	o := l.owners[ownerID]
	if o == nil {
		o = &owner{}
		l.owners[ownerID] = o
	}
	o.plan = plan.clone()
	o.phase = phase
	l.apply(o, next)
	return f, nil
}

// Restore charges an owner without the admission check: the owner's
// processes exist (a role restart re-reads what it recorded), so its memory
// is held whatever the limits say now. Use it for nothing else.
func (l *Ledger) Restore(ownerID string, plan Plan, phase string) error {
	if err := plan.check(l); err != nil {
		return err
	}
	next, err := plan.For(phase)
	if err != nil {
		return err
	}
	o := l.owners[ownerID]
	if o == nil {
		o = &owner{}
		l.owners[ownerID] = o
	}
	o.plan = plan.clone()
	o.phase = phase
	l.apply(o, next)
	return nil
}

// SetPhase moves an owner to the charge of another phase of its plan.
// Lowering is always admitted; raising (a wake) is checked like Place.
func (l *Ledger) SetPhase(ownerID, phase string) (Forecast, error) {
	o := l.owners[ownerID]
	if o == nil {
		return Forecast{}, fmt.Errorf("%w %q", ErrUnknownOwner, ownerID)
	}
	next, err := o.plan.For(phase)
	if err != nil {
		return Forecast{}, err
	}
	f := l.forecast(o.cur, next)
	if !f.Fits {
		return f, &BlockedError{Owner: ownerID, Phase: phase, Shortfalls: f.Blocked}
	}
	o.phase = phase
	l.apply(o, next)
	return f, nil
}

// apply replaces an owner's charges by next and keeps the sums.
func (l *Ledger) apply(o *owner, next Charges) {
	if o.cur == nil {
		o.cur = make(Charges, len(l.domains))
	}
	for i := range l.domains {
		n := at(next, i)
		l.charged[i] += n - o.cur[i]
		o.cur[i] = n
	}
	l.epoch++
}

// Release drops every charge of an owner; it reports whether the owner was
// held.
func (l *Ledger) Release(ownerID string) bool {
	o := l.owners[ownerID]
	if o == nil {
		return false
	}
	for i := range l.domains {
		l.charged[i] -= o.cur[i]
	}
	delete(l.owners, ownerID)
	l.epoch++
	return true
}

// Has reports whether the ledger holds an owner.
func (l *Ledger) Has(ownerID string) bool { return l.owners[ownerID] != nil }

// Charged returns what all owners hold in the domain with index i.
func (l *Ledger) Charged(i int) int64 { return l.charged[i] }

func (p Plan) clone() Plan {
	cp := func(c Charges) Charges {
		if c == nil {
			return nil
		}
		return append(Charges(nil), c...)
	}
	return Plan{Startup: cp(p.Startup), Ready: cp(p.Ready), Parked: cp(p.Parked), ParkedHost: cp(p.ParkedHost)}
}

// OwnerState is an owner as a snapshot shows it.
type OwnerState struct {
	ID    string `json:"id"`
	Phase string `json:"phase"`
	// Charges is what the owner holds now, by domain.
	Charges map[string]int64 `json:"charges"`
	// Plan is the owner's charge in each phase, by domain.
	Plan map[string]map[string]int64 `json:"plan"`
}

// Owner returns one owner's state.
func (l *Ledger) Owner(ownerID string) (OwnerState, bool) {
	o := l.owners[ownerID]
	if o == nil {
		return OwnerState{}, false
	}
	return l.ownerState(ownerID, o), true
}

func (l *Ledger) ownerState(id string, o *owner) OwnerState {
	s := OwnerState{
		ID: id, Phase: o.phase, Charges: l.ByName(o.cur),
		Plan: map[string]map[string]int64{
			PhaseStartup: l.ByName(o.plan.Startup),
			PhaseReady:   l.ByName(o.plan.Ready),
			PhaseParked:  l.ByName(o.plan.Parked),
		},
	}
	if o.plan.ParkedHost != nil {
		s.Plan[PhaseParkedHost] = l.ByName(o.plan.ParkedHost)
	}
	return s
}

// DomainState is a domain with what is charged in it.
type DomainState struct {
	Domain
	// Room is min(managed limit, capacity − max(reserve, external)).
	Room int64 `json:"room_bytes"`
	// Charged is the sum of every owner's charge.
	Charged int64 `json:"charged_bytes"`
	// Free is Room − Charged (0 when over, which only a restore can cause).
	Free int64 `json:"free_bytes"`
}

// Snapshot is the whole ledger at one epoch.
type Snapshot struct {
	Epoch   uint64        `json:"epoch"`
	Domains []DomainState `json:"domains"`
	Owners  []OwnerState  `json:"owners"`
}

// Snapshot copies the ledger's state (owners sorted by ID).
func (l *Ledger) Snapshot() Snapshot {
	s := Snapshot{Epoch: l.epoch}
	for i, d := range l.domains {
		room := d.Room()
		free := room - l.charged[i]
		if free < 0 {
			free = 0
		}
		s.Domains = append(s.Domains, DomainState{Domain: d, Room: room, Charged: l.charged[i], Free: free})
	}
	ids := make([]string, 0, len(l.owners))
	for id := range l.owners {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		s.Owners = append(s.Owners, l.ownerState(id, l.owners[id]))
	}
	return s
}

// Forecast is the outcome of a would-be change.
type Forecast struct {
	// Fits is true when every domain stays within its room.
	Fits bool
	// Blocked lists the domains that would go over, in domain order.
	Blocked []Shortfall
}

// Shortfall is one domain a change does not fit in, with the figures a
// refusal names.
type Shortfall struct {
	Domain     string `json:"domain"`
	Kind       string `json:"kind"`
	DeviceUUID string `json:"device_uuid,omitempty"`
	// Need is the owner's charge in the domain after the change.
	Need int64 `json:"need_bytes"`
	// Free is what the domain has left for the owner (room − others).
	Free int64 `json:"free_bytes"`
	// Limit is the domain's managed limit.
	Limit int64 `json:"limit_bytes"`
	// Room is min(limit, capacity − max(reserve, external)).
	Room     int64 `json:"room_bytes"`
	Capacity int64 `json:"capacity_bytes"`
	Reserve  int64 `json:"free_reserve_bytes"`
	External int64 `json:"external_bytes"`
	// Charged is what the other owners hold.
	Charged int64 `json:"charged_bytes"`
	// Short is Need − Free (MaxInt64 when the sum overflows).
	Short int64 `json:"short_bytes"`
}

// String renders the figures for people: "gpu0: needs 8GiB, 3GiB free of
// a 23GiB managed limit (20GiB charged), 5GiB short".
func (s Shortfall) String() string {
	msg := fmt.Sprintf("%s: needs %s, %s free of a %s managed limit (%s charged",
		s.Domain, formatBytes(s.Need), formatBytes(s.Free), formatBytes(s.Limit), formatBytes(s.Charged))
	if s.External > s.Reserve {
		msg += fmt.Sprintf(", %s held outside CapyCTL", formatBytes(s.External))
	}
	msg += ")"
	if s.Short == math.MaxInt64 {
		return msg + ", the sum overflows"
	}
	return msg + fmt.Sprintf(", %s short", formatBytes(s.Short))
}

// BlockedError is a change the ledger refused.
type BlockedError struct {
	Owner      string
	Phase      string
	Shortfalls []Shortfall
}

// Error names every domain that does not fit.
func (e *BlockedError) Error() string {
	parts := make([]string, 0, len(e.Shortfalls))
	for _, s := range e.Shortfalls {
		parts = append(parts, s.String())
	}
	return fmt.Sprintf("%s does not fit (%s): %s", e.Owner, e.Phase, strings.Join(parts, "; "))
}
