// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk"
	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
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
	exit *pb.ProbeResponse
	// evict lets a start or wake make room by evicting idle models.
	evict bool
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
			err := in.handle(c)
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

// persist writes r to the store; a failure is logged and coded.
func (in *instance) persist(r *structs.InstanceRecord) error {
	if err := in.m.cfg.Store.PutInstance(r); err != nil {
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
	stored, err := in.move(to, why, f)
	if err != nil {
		return err
	}
	return stored
}

// move is transition, returning the store's failure apart from the
// table's refusal.
func (in *instance) move(to structs.InstanceState, why string, f func(r *structs.InstanceRecord)) (stored, err error) {
	in.mu.Lock()
	from := in.rec.State
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
	in.rec.State = to
	in.rec.Since = in.m.cfg.Now().UTC()
	in.rec.LastTransition = describe(from, to, why)
	if f != nil {
		f(&in.rec)
	}
	r := in.rec
	in.mu.Unlock()
	// The router sees the change first: routing opens or closes at once.
	in.m.rebuildRoutes()
	stored = in.persist(&r)
	payload := map[string]any{"from": string(from), "to": string(to), "generation": r.Generation}
	if why != "" {
		payload["why"] = why
	}
	if r.LastError != nil && (to == structs.StateFailed || to == structs.StateStopped) {
		payload["code"] = string(r.LastError.Code)
	}
	in.m.event("instance_"+string(to), in.dep, in.id, payload)
	in.m.logger.Info("instance transition", "instance", in.id, "from", from, "to", to, "why", why)
	return stored, nil
}

func (in *instance) handle(c *command) error {
	switch c.kind {
	case cmdStart:
		return in.start(c.why, c.evict)
	case cmdPark:
		return in.park(c.why, false)
	case cmdEvict:
		return in.evictSelf(c.why)
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

// start launches the engine and waits for readiness (or wakes a parked
// instance). With evict, a start that does not fit makes room by parking or
// stopping idle models.
func (in *instance) start(why string, evict bool) error {
	rec := in.snapshot()
	switch rec.State {
	case structs.StateReady:
		return nil
	case structs.StateParked:
		return in.wake(why, evict)
	case structs.StateStopped, structs.StateFailed:
	default:
		if rec.State == structs.StateStopping {
			return structs.Errf(structs.CodeStillStopping, "instance %s is still stopping", in.id)
		}
		return structs.Errf(structs.CodeConflict, "instance %s is %s", in.id, rec.State)
	}
	m := in.m
	ctx := m.ctx
	dr, ok := m.spec(in.dep)
	if !ok {
		return structs.Errf(structs.CodeNotFound, "no deployment %s", in.dep)
	}
	spec := &dr.Spec
	fail := func(err error) error {
		e := structs.AsError(err)
		in.update(func(r *structs.InstanceRecord) {
			r.LastError = &structs.ErrorRecord{Code: e.Code, Message: e.Message, At: m.cfg.Now().UTC()}
		})
		return err
	}
	eng, err := m.resolveEngine(spec.Engine)
	if err != nil {
		return fail(err)
	}
	drv, err := m.cfg.Drivers.Driver(ctx, eng.Family)
	if err != nil {
		return fail(err)
	}
	desc, err := m.cfg.Drivers.Describe(ctx, eng.Family)
	if err != nil {
		return fail(driverErr(err, "describe driver"))
	}
	if !contains(desc.GetCapabilities().GetApis(), spec.API) {
		return fail(structs.Errf(structs.CodeCapabilityMissing+":"+structs.Code(spec.API),
			"the %s driver cannot serve api %q", eng.Family, spec.API))
	}
	modelDir, err := m.resolveModel(spec)
	if err != nil {
		return fail(err)
	}
	release, err := in.acquire(ctx, eng.Family)
	if err != nil {
		return err
	}
	defer release()

	port, err := m.cfg.Ports.Lease(in.id)
	if err != nil {
		return fail(err)
	}
	launchID := randomID()
	launchDir := filepath.Join(m.cfg.Host.StateDir, "launches", in.dep, fmt.Sprintf("%d-%s", in.idx, launchID))
	if err := os.MkdirAll(launchDir, 0o700); err != nil {
		m.cfg.Ports.Release(port)
		return fail(structs.Wrap(structs.CodeInternal, err, "create launch directory"))
	}
	installation := ToInstallation(eng)
	host := m.hostPolicy(eng)
	pdep := ToDeployment(spec, dr.Revision, modelDir)
	pdep.EngineConfigJson = familyConfig(spec, eng.Family)
	lctx := &pb.LaunchContext{Port: int32(port), LaunchDir: launchDir, InstanceId: in.id, LaunchId: launchID}
	cleanupPort := func() { m.cfg.Ports.Release(port); _ = os.RemoveAll(launchDir) }

	// First plan: validation and memory hints.
	plan, err := drv.Plan(ctx, &pb.PlanRequest{Installation: installation, Deployment: pdep, Host: host, Launch: lctx})
	if err != nil {
		cleanupPort()
		return fail(driverErr(err, "plan"))
	}
	if err := refusalErr(plan.GetRefusals()); err != nil {
		cleanupPort()
		return fail(err)
	}
	placer := m.cfg.Placer
	if placer == nil {
		placer = noPlacer{}
	}
	var grant *Grant
	err = m.withRoom(ctx, in, evict, func() error {
		var rerr error
		grant, rerr = placer.Reserve(ctx, Reservation{
			Owner: in.id, Deployment: spec, Revision: dr.Revision, Engine: eng, Hints: plan.GetHints(), Residency: plan.GetResidency(),
		})
		return rerr
	})
	if err != nil {
		cleanupPort()
		return fail(err)
	}
	if grant != nil && (grant.DeviceBytes > 0 || len(grant.DeviceUUIDs) > 0 || len(grant.Env) > 0) {
		lctx.DeviceUuids = grant.DeviceUUIDs
		lctx.DeviceBytes = grant.DeviceBytes
		lctx.DeviceTotalBytes = grant.DeviceTotal
		lctx.KvCacheBytes = grant.KVBytes
		if len(grant.Env) > 0 {
			if host.HostEnv == nil {
				host.HostEnv = map[string]string{}
			}
			for k, v := range grant.Env {
				host.HostEnv[k] = v
			}
		}
		plan, err = drv.Plan(ctx, &pb.PlanRequest{Installation: installation, Deployment: pdep, Host: host, Launch: lctx})
		if err == nil {
			err = refusalErr(plan.GetRefusals())
		}
		if err != nil {
			placer.Release(in.id)
			cleanupPort()
			return fail(driverErr(err, "plan"))
		}
	}

	engineKey, adminKey := randomKey(), randomKey()
	launch := &structs.LaunchRecord{
		LaunchID: launchID, Port: port, LaunchDir: launchDir, StartedAt: m.cfg.Now().UTC(),
		DeviceUUIDs: lctx.DeviceUuids, EngineKey: engineKey, AdminKey: adminKey,
		Argv: plan.GetArgv(), Env: plan.GetEnv(),
	}
	// IMPORTANT: the launch is recorded before the engine exists, and its
	// process identities as soon as it does; an engine whose record cannot
	// be written is never left running (after a restart it would hold
	// memory outside the ledger).
	if err := in.transitionStored(structs.StateStarting, why, func(r *structs.InstanceRecord) {
		r.Launch = launch
		r.Endpoint = nil
		r.Engine = eng.Name
		r.Driver = eng.Family
		r.Revision = dr.Revision
		r.Generation++
		r.Residency = plan.GetResidency()
		r.Parsers = nil
		if p := plan.GetParsers(); p != nil && (p.GetToolCall() != "" || p.GetReasoning() != "" || p.GetProvenance() != "") {
			r.Parsers = &structs.Parsers{ToolCall: p.GetToolCall(), Reasoning: p.GetReasoning(), Provenance: p.GetProvenance()}
		}
		r.LastError = nil
		r.Released = ""
		r.Phase = "startup"
	}); err != nil {
		placer.Release(in.id)
		cleanupPort()
		if structs.HasCode(err, structs.CodeStoreUnavailable) {
			in.unrecorded(err)
		}
		return err
	}

	resp, err := drv.Start(ctx, &pb.StartRequest{
		Installation: installation, Deployment: pdep, Host: host, Launch: lctx, Plan: plan,
		EngineKey: engineKey, AdminKey: adminKey,
	})
	if err != nil {
		// A failed Start may still have spawned something: prove it gone.
		in.cleanupLaunch(drv, nil)
		placer.Release(in.id)
		m.cfg.Ports.Release(port)
		e := structs.AsError(driverErr(err, "start engine"))
		if e.Code == structs.CodeInternal {
			e.Code = structs.CodeLaunchFailed
		}
		_ = in.transition(structs.StateFailed, e.Message, func(r *structs.InstanceRecord) {
			r.LastError = &structs.ErrorRecord{Code: e.Code, Message: e.Message, At: m.cfg.Now().UTC()}
			r.Phase = ""
		})
		return e
	}
	if err := in.update(func(r *structs.InstanceRecord) {
		r.Launch.Pgid = int(resp.GetLaunch().GetPgid())
		r.Launch.Processes = fromLaunch(resp.GetLaunch())
	}); err != nil {
		in.cleanupLaunch(drv, nil)
		placer.Release(in.id)
		m.cfg.Ports.Release(port)
		in.unrecorded(err)
		return err
	}
	if po, ok := placer.(ProcessObserver); ok {
		po.Launched(in.id, int(resp.GetLaunch().GetPgid()), fromLaunch(resp.GetLaunch()))
	}

	deadline := time.Duration(plan.GetStartupTimeoutMs()) * time.Millisecond
	if spec.Timeouts.Initialize > 0 {
		deadline = spec.Timeouts.Initialize.D()
	}
	if deadline <= 0 {
		deadline = m.cfg.DefaultStartupTimeout
	}
	pctx, cancel := context.WithTimeout(ctx, deadline+10*time.Second)
	probe, err := drv.Probe(pctx, &pb.ProbeRequest{InstanceId: in.id, Kind: pb.ProbeKind_PROBE_KIND_READINESS, DeadlineMs: deadline.Milliseconds()})
	cancel()
	if err == nil && !probe.GetReady() {
		err = probeFailure(probe, deadline)
	}
	if err != nil {
		e := structs.AsError(driverErr(err, "readiness"))
		if e.Code == structs.CodeInternal {
			e.Code = structs.CodeLaunchFailed
		}
		in.cleanupLaunch(drv, nil)
		placer.Release(in.id)
		m.cfg.Ports.Release(port)
		_ = in.transition(structs.StateFailed, e.Message, func(r *structs.InstanceRecord) {
			r.LastError = &structs.ErrorRecord{Code: e.Code, Message: e.Message, At: m.cfg.Now().UTC()}
			r.Phase = ""
			r.Endpoint = nil
		})
		return e
	}
	ep := toEndpoint(probe.GetEndpoint())
	if ep == nil {
		ep = toEndpoint(resp.GetEndpoint())
	}
	if err := placer.Phase(in.id, "ready"); err != nil {
		m.logger.Warn("ledger phase change failed", "instance", in.id, "error", err)
	}
	if err := in.transition(structs.StateReady, why, func(r *structs.InstanceRecord) {
		r.Endpoint = ep
		if probe.GetCanary() != "" && r.Canary == "" {
			r.Canary = probe.GetCanary()
		}
		r.Phase = "ready"
		r.Attempts = 0
		r.LastUsedAt = m.cfg.Now().UTC()
	}); err != nil {
		return err
	}
	in.startMonitor(drv)
	return nil
}

// unrecorded marks a launch undone because its record could not be
// stored: failed, with the reason (a write that may fail too: it is
// logged, and the instance stays failed in memory).
func (in *instance) unrecorded(err error) {
	e := structs.AsError(err)
	_ = in.transition(structs.StateFailed, e.Message, func(r *structs.InstanceRecord) {
		r.LastError = &structs.ErrorRecord{Code: e.Code, Message: e.Message, At: in.m.cfg.Now().UTC()}
		r.Phase = ""
		r.Endpoint = nil
	})
}

// probeFailure turns a failed readiness probe into a coded error with the
// engine's last log lines.
func probeFailure(p *pb.ProbeResponse, deadline time.Duration) error {
	code := structs.Code(p.GetCode())
	var msg string
	switch {
	case p.GetExited():
		if code == "" {
			code = structs.CodeLaunchFailed
		}
		msg = fmt.Sprintf("the engine exited with code %d while starting", p.GetExitCode())
	case code == "":
		code = structs.CodeStartupTimeout
		msg = fmt.Sprintf("the engine was not ready within %s", deadline)
	default:
		msg = p.GetDetail()
	}
	if p.GetDetail() != "" && !strings.Contains(msg, p.GetDetail()) {
		msg += ": " + p.GetDetail()
	}
	if lines := p.GetLastLogLines(); len(lines) > 0 {
		msg += "; last log lines:\n  " + strings.Join(lines, "\n  ")
	}
	e := structs.Errf(code, "%s", msg)
	if lines := p.GetLastLogLines(); len(lines) > 0 {
		e.WithDetail("last_log_lines", lines)
	}
	if p.GetExited() {
		e.WithDetail("exit_code", p.GetExitCode())
	}
	return e
}

// refusalErr turns the driver's refusals into one coded error naming them
// all (the first one's code).
func refusalErr(rs []*pb.Refusal) error {
	if len(rs) == 0 {
		return nil
	}
	msgs := make([]string, 0, len(rs))
	for _, r := range rs {
		m := r.GetMessage()
		if r.GetField() != "" {
			m = r.GetField() + ": " + m
		}
		msgs = append(msgs, m)
	}
	e := structs.Errf(structs.Code(rs[0].GetCode()), "%s", strings.Join(msgs, "; "))
	var rows []map[string]string
	for _, r := range rs {
		rows = append(rows, map[string]string{"code": r.GetCode(), "message": r.GetMessage(), "field": r.GetField()})
	}
	return e.WithDetail("refusals", rows)
}

// cleanupLaunch ends whatever a launch left, proving it gone.
func (in *instance) cleanupLaunch(drv sdk.Driver, r *structs.InstanceRecord) *pb.StopResponse {
	rec := in.snapshot()
	if r != nil {
		rec = *r
	}
	if rec.Launch == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(in.m.ctx, in.m.cfg.StopGrace+30*time.Second)
	defer cancel()
	resp, err := drv.Stop(ctx, &pb.StopRequest{InstanceId: in.id, GraceMs: in.m.cfg.StopGrace.Milliseconds(), Launch: toLaunch(rec.Launch)})
	if err != nil {
		in.m.logger.Warn("stop after a failed launch failed", "instance", in.id, "error", err)
		return nil
	}
	return resp
}

// stop ends the engine and proves it gone.
func (in *instance) stop(why string) error {
	rec := in.snapshot()
	m := in.m
	switch rec.State {
	case structs.StateStopped:
		return nil
	case structs.StateFailed:
		return in.transition(structs.StateStopped, why, nil)
	}
	in.stopMonitor()
	if rec.Launch == nil {
		return in.transition(structs.StateStopped, why, nil)
	}
	if rec.State != structs.StateStopping {
		if err := in.transition(structs.StateStopping, why, nil); err != nil {
			return err
		}
	}
	drv, err := m.cfg.Drivers.Driver(m.ctx, rec.Driver)
	if err != nil {
		return err
	}
	resp := in.cleanupLaunch(drv, nil)
	if resp == nil || !resp.GetGone() {
		detail := "the engine's processes could not be proven gone"
		if resp != nil && resp.GetDetail() != "" {
			detail = resp.GetDetail()
		}
		e := structs.Errf(structs.CodeStillStopping, "instance %s: %s", in.id, detail)
		in.update(func(r *structs.InstanceRecord) {
			r.LastError = &structs.ErrorRecord{Code: e.Code, Message: e.Message, At: m.cfg.Now().UTC()}
		})
		return e
	}
	in.release(rec)
	return in.transition(structs.StateStopped, why, func(r *structs.InstanceRecord) {
		r.Endpoint = nil
		r.Phase = ""
		r.Released = "stopped"
	})
}

// release gives back the memory and port of a launch whose processes are
// proven gone.
func (in *instance) release(rec structs.InstanceRecord) {
	in.m.stopped(in.id, rec.Generation)
	if in.m.cfg.Placer != nil {
		in.m.cfg.Placer.Release(in.id)
	}
	if rec.Launch != nil && rec.Launch.Port != 0 {
		in.m.cfg.Ports.Release(rec.Launch.Port)
	}
}

// exited handles an engine that died while it should be running.
func (in *instance) exited(p *pb.ProbeResponse) error {
	rec := in.snapshot()
	if rec.State != structs.StateReady && rec.State != structs.StateParked {
		return nil
	}
	m := in.m
	in.stopMonitor()
	msg := fmt.Sprintf("the engine exited with code %d", p.GetExitCode())
	if lines := p.GetLastLogLines(); len(lines) > 0 {
		msg += "; last log lines:\n  " + strings.Join(lines, "\n  ")
	}
	drv, err := m.cfg.Drivers.Driver(m.ctx, rec.Driver)
	if err == nil {
		// Helpers the engine started may remain: end the whole group.
		if resp := in.cleanupLaunch(drv, nil); resp != nil && !resp.GetGone() {
			m.logger.Warn("processes of an exited engine remain", "instance", in.id)
			return in.transition(structs.StateStopping, "engine exited; helpers remain", nil)
		}
	}
	in.release(rec)
	m.event("engine_exited", in.dep, in.id, map[string]any{"exit_code": p.GetExitCode()})
	return in.transition(structs.StateStopped, "engine exited", func(r *structs.InstanceRecord) {
		r.LastError = &structs.ErrorRecord{Code: structs.CodeEngineError, Message: msg, At: m.cfg.Now().UTC()}
		r.Endpoint = nil
		r.Phase = ""
		r.Released = "engine exited"
	})
}

// recover re-attaches to a recorded launch after a core restart (settle
// true: the instance may move to reconciling and its final state is decided
// here) or a driver relaunch (settle false: the state stays unless the
// engine is gone).
func (in *instance) recover(why string, settle bool) error {
	rec := in.snapshot()
	m := in.m
	if rec.Launch == nil || !holdsProcesses(rec.State) {
		return nil
	}
	prior := rec.State
	if settle && prior != structs.StateReconciling {
		if err := in.transition(structs.StateReconciling, why, nil); err != nil {
			return err
		}
	}
	drv, err := m.cfg.Drivers.Driver(m.ctx, rec.Driver)
	if err != nil {
		return in.unsettled(err)
	}
	var eng *structs.EngineRecord
	if e, err := m.resolveEngine(rec.Engine); err == nil {
		eng = e
	}
	dr, _ := m.spec(in.dep)
	req := &pb.RecoverRequest{
		InstanceId: in.id, Launch: toLaunch(rec.Launch), Host: m.hostPolicy(eng),
		Context:   &pb.LaunchContext{Port: int32(rec.Launch.Port), LaunchDir: rec.Launch.LaunchDir, InstanceId: in.id, LaunchId: rec.Launch.LaunchID, DeviceUuids: rec.Launch.DeviceUUIDs},
		EngineKey: rec.Launch.EngineKey, AdminKey: rec.Launch.AdminKey,
		RecordedState: string(prior),
	}
	if prior == structs.StateParked || prior == structs.StateParking || prior == structs.StateWaking {
		req.ParkTier = rec.Residency
	}
	if eng != nil {
		req.Installation = ToInstallation(eng)
	}
	if dr.Name != "" {
		modelDir, _ := m.resolveModel(&dr.Spec)
		req.Deployment = ToDeployment(&dr.Spec, rec.Revision, modelDir)
		if eng != nil {
			req.Deployment.EngineConfigJson = familyConfig(&dr.Spec, eng.Family)
		}
	}
	ctx, cancel := context.WithTimeout(m.ctx, time.Minute)
	defer cancel()
	resp, err := drv.Recover(ctx, req)
	if err != nil {
		return in.unsettled(driverErr(err, "recover"))
	}
	switch resp.GetState() {
	case pb.RecoverState_RECOVER_STATE_GONE:
		in.stopMonitor()
		in.release(rec)
		return in.transition(structs.StateStopped, "engine gone: "+resp.GetDetail(), func(r *structs.InstanceRecord) {
			r.Endpoint = nil
			r.Phase = ""
			r.Released = "engine gone"
			if prior == structs.StateReady || prior == structs.StateStarting {
				r.LastError = &structs.ErrorRecord{Code: structs.CodeEngineError, Message: "the engine was gone when re-attached: " + resp.GetDetail(), At: m.cfg.Now().UTC()}
			}
		})
	case pb.RecoverState_RECOVER_STATE_RUNNING:
	default:
		return in.unsettled(structs.Errf(structs.CodeUnavailable, "re-attach uncertain: %s", resp.GetDetail()))
	}
	ep := toEndpoint(resp.GetEndpoint())
	if l := resp.GetLaunch(); l != nil && len(l.GetProcesses()) > 0 {
		// The driver may have found identities the core never recorded.
		in.update(func(r *structs.InstanceRecord) {
			if r.Launch != nil {
				r.Launch.Pgid = int(l.GetPgid())
				r.Launch.Processes = fromLaunch(l)
			}
		})
	}
	if settle && resp.GetParked() {
		// The engine holds its memory released: it is parked, whatever
		// step the restart interrupted (a park that completed, a wake that
		// had not begun).
		in.adopt("parked")
		if err := in.transition(structs.StateParked, "re-attached: the engine is parked", func(r *structs.InstanceRecord) {
			r.Endpoint = ep
			r.Phase = "parked"
		}); err != nil {
			return err
		}
		in.startMonitor(drv)
		return nil
	}
	if !settle {
		if ep != nil && in.state() == structs.StateReady {
			in.update(func(r *structs.InstanceRecord) { r.Endpoint = ep })
			m.rebuildRoutes()
		}
		in.startMonitor(drv)
		return nil
	}
	switch prior {
	case structs.StateStopping:
		// A stop was in progress: finish it.
		if err := in.transition(structs.StateStopping, "finish the stop begun before the restart", nil); err != nil {
			return err
		}
		return in.stop("finish the stop begun before the restart")
	}
	// Prove readiness in this session before serving again.
	pctx, pcancel := context.WithTimeout(m.ctx, 2*time.Minute)
	probe, err := drv.Probe(pctx, &pb.ProbeRequest{InstanceId: in.id, Kind: pb.ProbeKind_PROBE_KIND_READINESS, DeadlineMs: 90_000})
	pcancel()
	if err != nil || !probe.GetReady() {
		if err == nil {
			err = probeFailure(probe, 90*time.Second)
		}
		return in.unsettled(driverErr(err, "readiness after re-attach"))
	}
	if probe.GetEndpoint() != nil {
		ep = toEndpoint(probe.GetEndpoint())
	}
	in.adopt("ready")
	if err := in.transition(structs.StateReady, "re-attached", func(r *structs.InstanceRecord) {
		r.Endpoint = ep
		r.Phase = "ready"
	}); err != nil {
		return err
	}
	in.startMonitor(drv)
	return nil
}

// adopt tells the placer what a re-attached instance holds, so the ledger
// a restarted core rebuilds charges what is really running.
func (in *instance) adopt(phase string) {
	p := in.m.placer()
	if a, ok := p.(interface {
		Adopt(owner, phase string, rec structs.InstanceRecord)
	}); ok {
		a.Adopt(in.id, phase, in.snapshot())
		return
	}
	if err := p.Phase(in.id, phase); err != nil {
		in.m.logger.Warn("ledger phase after re-attach", "instance", in.id, "error", err)
	}
}

// unsettled records why recovery could not decide; the instance stays
// reconciling and charged.
func (in *instance) unsettled(err error) error {
	e := structs.AsError(err)
	in.update(func(r *structs.InstanceRecord) {
		r.LastError = &structs.ErrorRecord{Code: e.Code, Message: e.Message, At: in.m.cfg.Now().UTC()}
	})
	return err
}

// startMonitor watches a running engine's process and reports its death to
// the lane within about one liveness interval.
func (in *instance) startMonitor(drv sdk.Driver) {
	in.stopMonitor()
	ctx, cancel := context.WithCancel(in.m.ctx)
	in.monMu.Lock()
	in.monCancel = cancel
	in.monMu.Unlock()
	in.m.goTracked(func() {
		t := time.NewTicker(in.m.cfg.LivenessInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
			resp, err := drv.Probe(pctx, &pb.ProbeRequest{InstanceId: in.id, Kind: pb.ProbeKind_PROBE_KIND_LIVENESS})
			pcancel()
			if err != nil {
				// The driver is unreachable (relaunching): that says nothing
				// about the engine.
				continue
			}
			if resp.GetExited() || !resp.GetAlive() {
				c := &command{kind: cmdExited, why: "engine exited", done: make(chan error, 1), exit: resp}
				in.m.goTracked(func() { _ = in.send(in.m.ctx, c) })
				return
			}
		}
	})
}

func (in *instance) stopMonitor() {
	in.monMu.Lock()
	defer in.monMu.Unlock()
	if in.monCancel != nil {
		in.monCancel()
		in.monCancel = nil
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
