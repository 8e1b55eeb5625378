// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk"
)

type cmdKind int

const (
	cmdStart cmdKind = iota
	cmdStop
	cmdRecover
	cmdRehandle
	cmdExited
	cmdSettleStopped
	cmdPark
	cmdEvict
	cmdIdlePark
	cmdIdleStop
)

func (k cmdKind) String() string {
	return [...]string{"start", "stop", "recover", "rehandle", "exited", "settle", "park", "evict", "idle-park", "idle-stop"}[k]
}

type command struct {
	kind cmdKind
	why  string
	done chan error
	// exit carries what the monitor saw for cmdExited.
	exit *sdk.ProbeResponse
	// evict lets a start or wake make room by evicting other models; room
	// says how (roomIdle when only evict is set).
	evict bool
	room  roomMode
	// afterTurn marks an eviction whose victim's turn ended (switch.go):
	// it drains what the victim serves and ignores what waits for it.
	afterTurn bool
}

// instance is one instance and its lane: a goroutine that owns its state
// changes and performs one effect at a time.
type instance struct {
	m   *Manager
	id  string
	dep string
	idx int

	mu  sync.RWMutex
	rec structs.InstanceRecord

	cmds      chan *command
	quit      chan struct{}
	closeOnce sync.Once

	monMu     sync.Mutex
	monCancel context.CancelFunc

	// lastUsed is when a request last used the instance (unix nanos).
	lastUsed atomic.Int64
	// busy is true while the lane performs a command.
	busy atomic.Bool
	// charging is true while a start holds a ledger reservation that its
	// record does not show yet (the instance still stopped or failed): a
	// switch waits for it to move before it weighs the room.
	charging atomic.Bool
	// room is how the lane's current start or wake makes room (the
	// command's; read by withRoom, which runs in the lane).
	room roomMode
	// switched is set by a switch that made room for this instance: its
	// bring-in counts as swap time and completes the switch (turns.go).
	switched atomic.Pointer[switchRun]
	// evicting is set while the lane evicts the instance for a switch: its
	// park or stop counts as swap time; swapping while such a step runs.
	evicting atomic.Bool
	swapping atomic.Bool

	// startCancel ends the waits of a start under way (nil when no start
	// runs): its wait for a start slot and its readiness probe. An
	// operator's stop must not wait out a load, nor other starts.
	startMu     sync.Mutex
	startCancel context.CancelFunc
	stopAsked   atomic.Bool
	// stopRetrying is set while a chain of stop retries runs (retryStop).
	stopRetrying atomic.Bool
	// retired is set once a new revision replaces the instance, or its
	// deployment is being deleted: it starts no more (a start queued
	// behind the stop that retires it would launch an engine no
	// deployment owns any more).
	retired atomic.Bool
}

// abortStartup ends the waits of a start under way (for a start slot, for
// readiness), so that a stop queued behind it runs now instead of after
// the startup deadline (the start ends failed and its launch is cleaned up
// first).
func (in *instance) abortStartup() {
	in.startMu.Lock()
	defer in.startMu.Unlock()
	if in.startCancel != nil {
		in.stopAsked.Store(true)
		in.startCancel()
	}
}

// beginStartup returns the context of a start's waits, which abortStartup
// ends; endStartup ends it with the start.
func (in *instance) beginStartup() context.Context {
	ctx, cancel := context.WithCancel(in.m.ctx)
	in.startMu.Lock()
	in.stopAsked.Store(false)
	in.startCancel = cancel
	in.startMu.Unlock()
	return ctx
}

// endStartup ends the waits of the start that ended.
func (in *instance) endStartup() {
	in.startMu.Lock()
	defer in.startMu.Unlock()
	if in.startCancel != nil {
		in.startCancel()
		in.startCancel = nil
	}
}

func (m *Manager) newInstance(rec *structs.InstanceRecord) *instance {
	in := &instance{
		m:    m,
		id:   rec.ID(),
		dep:  rec.Deployment,
		idx:  rec.Index,
		rec:  *rec,
		cmds: make(chan *command),
		quit: make(chan struct{}),
	}
	if !rec.LastUsedAt.IsZero() {
		in.lastUsed.Store(rec.LastUsedAt.UnixNano())
	}
	// IMPORTANT: callers hold m.mu.
	m.byID[in.id] = in
	if !m.goTracked(in.run) {
		in.close() // a closed manager: commands answer shutting_down
	}
	return in
}

func (in *instance) run() {
	for {
		select {
		case c := <-in.cmds:
			in.busy.Store(true)
			in.room = c.room
			if c.evict && c.room == roomNone {
				in.room = roomIdle
			}
			err := in.handle(c)
			in.room = roomNone
			in.busy.Store(false)
			c.done <- err
		case <-in.quit:
			in.stopMonitor()
			return
		}
	}
}

func (in *instance) close() { in.closeOnce.Do(func() { close(in.quit) }) }

// do sends a command to the lane and waits for its result. If ctx ends
// first the caller stops waiting; the effect itself runs to its end.
func (in *instance) do(ctx context.Context, kind cmdKind, why string) error {
	return in.send(ctx, &command{kind: kind, why: why, done: make(chan error, 1)})
}

func (in *instance) send(ctx context.Context, c *command) error {
	select {
	case in.cmds <- c:
	case <-in.quit:
		return structs.Errf(structs.CodeShuttingDown, "instance %s is closed", in.id)
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-c.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (in *instance) snapshot() structs.InstanceRecord {
	in.mu.RLock()
	defer in.mu.RUnlock()
	r := in.rec
	return r
}

func (in *instance) state() structs.InstanceState {
	in.mu.RLock()
	defer in.mu.RUnlock()
	return in.rec.State
}

// update changes the record under the lock and persists it (the lane is the
// only writer). A store failure is logged and returned as store_unavailable;
// the record in memory has changed either way. Only a launch's own records
// must be stored (see start); elsewhere callers may go on without.
func (in *instance) update(f func(r *structs.InstanceRecord)) error {
	in.mu.Lock()
	f(&in.rec)
	r := in.rec
	in.mu.Unlock()
	return in.persist(&r)
}

// persist writes r to the store; a failure is logged and coded. Either
// way the record changed in memory: Changed's waiters wake.
func (in *instance) persist(r *structs.InstanceRecord) error {
	return in.persistWith(r, nil, nil)
}

// persistWith is persist with the transition's event journaled in the same
// synced write, and what charge adds to it (a launch's charge record, see
// ChargeRecorder; nil for none).
func (in *instance) persistWith(r *structs.InstanceRecord, ev *structs.Event, charge chargeWrite) error {
	defer in.m.recordsChanged()
	var err error
	switch {
	case charge != nil:
		err = charge(func(meta map[string]string) error { return in.m.cfg.Store.PutInstanceEvent(r, ev, meta) })
	case ev != nil:
		err = in.m.cfg.Store.PutInstanceEvent(r, ev, nil)
	default:
		err = in.m.cfg.Store.PutInstance(r)
	}
	if err != nil {
		in.m.logger.Error("could not store an instance", "instance", in.id, "state", r.State, "error", err)
		return structs.Wrap(structs.CodeStoreUnavailable, err, "store the record of instance %s", in.id)
	}
	return nil
}

// transition moves the instance to a new state, checked against the table,
// persisted and journaled; the route table follows. A store failure is
// logged, not returned: the state has changed in memory and the router
// already follows it (transitionStored returns it).
func (in *instance) transition(to structs.InstanceState, why string, f func(r *structs.InstanceRecord)) error {
	_, err := in.move(to, why, f)
	return err
}

// transitionStored is transition for a record a launch cannot go without:
// a store failure is returned (store_unavailable) as well.
func (in *instance) transitionStored(to structs.InstanceState, why string, f func(r *structs.InstanceRecord)) error {
	return in.transitionCharged(to, why, f, nil)
}

// transitionCharged is transitionStored whose write carries what charge
// adds (a launch's charge record).
func (in *instance) transitionCharged(to structs.InstanceState, why string, f func(r *structs.InstanceRecord), charge chargeWrite) error {
	stored, err := in.moveWith(to, why, f, charge)
	if err != nil {
		return err
	}
	return stored
}

// move is transition, returning the store's failure apart from the
// table's refusal.
func (in *instance) move(to structs.InstanceState, why string, f func(r *structs.InstanceRecord)) (stored, err error) {
	return in.moveWith(to, why, f, nil)
}

// moveWith is move whose write carries what charge adds. The record and
// its event are one synced write: a crash leaves both or neither.
func (in *instance) moveWith(to structs.InstanceState, why string, f func(r *structs.InstanceRecord), charge chargeWrite) (stored, err error) {
	in.mu.Lock()
	from := in.rec.State
	since := in.rec.Since
	if from == to && f == nil {
		in.mu.Unlock()
		return nil, nil
	}
	if from != to {
		if err := checkTransition(from, to); err != nil {
			in.mu.Unlock()
			return nil, err
		}
	}
	now := in.m.cfg.Now().UTC()
	step := in.observeStep(from, to, now.Sub(since))
	in.rec.State = to
	in.rec.Since = now
	in.rec.LastTransition = describe(from, to, why)
	in.rec.Reason = "" // a transition that matters says its own (f)
	switch to {
	case structs.StateStopped, structs.StateFailed, structs.StateStarting:
		// Nothing is parked any more.
		in.rec.ParkTier, in.rec.ParkDetail = "", ""
	}
	if f != nil {
		f(&in.rec)
	}
	r := in.rec
	in.mu.Unlock()
	// The router sees the change first: routing opens or closes at once.
	in.m.rebuildRoutes()
	in.stepDone(from, to, step)
	payload := map[string]any{"from": string(from), "to": string(to), "generation": r.Generation}
	if why != "" {
		payload["why"] = why
	}
	if r.LastError != nil && (to == structs.StateFailed || to == structs.StateStopped) {
		payload["code"] = string(r.LastError.Code)
	}
	if to == structs.StateParked && r.ParkTier != "" {
		// Which tier the park chose (vLLM: level 1 host_backed, level 2
		// deep), and the driver's word on it.
		payload["tier"] = r.ParkTier
		if r.ParkDetail != "" {
			payload["detail"] = r.ParkDetail
		}
	}
	stored = in.persistWith(&r, in.m.newEvent("instance_"+string(to), in.dep, in.id, payload), charge)
	in.m.logger.Info("instance transition", "instance", in.id, "from", from, "to", to, "why", why)
	return stored, nil
}

func (in *instance) handle(c *command) error {
	switch c.kind {
	case cmdStart:
		if in.retired.Load() {
			// IMPORTANT: a request's activation or a retry may have picked
			// the instance before it was replaced or deleted.
			e := structs.Errf(structs.CodeUnavailable, "instance %s was replaced or is being deleted; retry", in.id)
			e.RetryAfter = 1
			return e
		}
		return in.start(c)
	case cmdPark:
		return in.park(c.why, false)
	case cmdEvict:
		return in.evictSelf(c.why, c.afterTurn)
	case cmdIdlePark:
		return in.idlePark(c.why)
	case cmdIdleStop:
		return in.idleStop(c.why)
	case cmdStop:
		return in.stop(c.why)
	case cmdRecover:
		return in.recover(c.why, true)
	case cmdRehandle:
		return in.recover(c.why, false)
	case cmdExited:
		return in.exited(c.exit)
	case cmdSettleStopped:
		if s := in.state(); s != structs.StateStopped && s != structs.StateFailed {
			return in.transition(structs.StateStopped, c.why, nil)
		}
		return nil
	}
	return fmt.Errorf("unknown command %v", c.kind)
}

// acquire takes one of the bounded start slots of a driver family.
func (in *instance) acquire(ctx context.Context, family string) (func(), error) {
	sem := in.m.startSlots(family)
	select {
	case sem <- struct{}{}:
		return func() { <-sem }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// startSlots returns a family's start slots, made on first use.
func (m *Manager) startSlots(family string) chan struct{} {
	m.slotsMu.Lock()
	defer m.slotsMu.Unlock()
	sem, ok := m.slots[family]
	if !ok {
		sem = make(chan struct{}, m.cfg.MaxConcurrentEffects)
		m.slots[family] = sem
	}
	return sem
}

// resolveEngine finds the engine registration a spec names: a registration
// name, or a family name meaning the one registration of that family.
func (m *Manager) resolveEngine(name string) (*structs.EngineRecord, error) {
	if e, err := m.cfg.Store.GetEngine(name); err == nil && e != nil {
		return e, nil
	}
	all, err := m.cfg.Store.ListEngines()
	if err != nil {
		return nil, structs.Wrap(structs.CodeInternal, err, "list engines")
	}
	var matches []*structs.EngineRecord
	for i := range all {
		if all[i].Family == name {
			matches = append(matches, &all[i])
		}
	}
	switch len(matches) {
	case 1:
		return matches[0], nil
	case 0:
		return nil, structs.Errf(structs.CodeEngineNotFound,
			"no engine %q is registered: add one with capyctl engine add", name)
	}
	names := make([]string, 0, len(matches))
	for _, e := range matches {
		names = append(names, e.Name)
	}
	return nil, structs.Errf(structs.CodeInvalidConfig,
		"engine %q is ambiguous: %d engines of that family are registered (%s); name one", name, len(matches), strings.Join(names, ", "))
}

// unrecorded marks a launch undone because its record could not be
// stored: failed, with the reason (a write that may fail too: it is
// logged, and the instance stays failed in memory).
func (in *instance) unrecorded(err error) {
	e := structs.AsError(err)
	_ = in.transition(structs.StateFailed, e.Message, func(r *structs.InstanceRecord) {
		r.Reason = structs.ReasonStartFailed
		r.LastError = &structs.ErrorRecord{Code: e.Code, Message: e.Message, At: in.m.cfg.Now().UTC()}
		r.Phase = ""
		r.Endpoint = nil
	})
}

// probeFailure turns a failed readiness probe into a coded error with the
// engine's last log lines.
func probeFailure(p *sdk.ProbeResponse, deadline time.Duration) error {
	code := structs.Code(p.Code)
	var msg string
	switch {
	case p.Exited:
		if code == "" {
			code = structs.CodeLaunchFailed
		}
		msg = fmt.Sprintf("the engine exited with code %d while starting", p.ExitCode)
	case code == "":
		code = structs.CodeStartupTimeout
		msg = fmt.Sprintf("the engine was not ready within %s", deadline)
	default:
		msg = p.Detail
	}
	if p.Detail != "" && !strings.Contains(msg, p.Detail) {
		msg += ": " + p.Detail
	}
	if lines := p.LastLogLines; len(lines) > 0 {
		msg += "; last log lines:\n  " + strings.Join(lines, "\n  ")
	}
	e := structs.Errf(code, "%s", msg)
	if lines := p.LastLogLines; len(lines) > 0 {
		e.WithDetail("last_log_lines", lines)
	}
	if p.Exited {
		e.WithDetail("exit_code", p.ExitCode)
	}
	return e
}

// refusalErr turns the driver's refusals into one coded error naming them
// all (the first one's code).
func refusalErr(rs []*sdk.Refusal) error {
	if len(rs) == 0 {
		return nil
	}
	msgs := make([]string, 0, len(rs))
	for _, r := range rs {
		m := r.Message
		if r.Field != "" {
			m = r.Field + ": " + m
		}
		msgs = append(msgs, m)
	}
	e := structs.Errf(structs.Code(rs[0].Code), "%s", strings.Join(msgs, "; "))
	var rows []map[string]string
	for _, r := range rs {
		rows = append(rows, map[string]string{"code": r.Code, "message": r.Message, "field": r.Field})
	}
	return e.WithDetail("refusals", rows)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
