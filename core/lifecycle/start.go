// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/capyctl/capyctl/core/ledger"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk"
)

// A start is a pipeline of steps, in the spirit of Nomad's task-runner
// hooks: resolve → lease a port → plan → reserve memory (evicting where
// allowed) → plan again with the grant → record the launch → launch →
// probe → ready. What a step takes is one of two kinds, and the step says
// which when it takes it:
//
//   - held for the start (take: a start slot of the driver's family): given
//     back when the start ends, whatever the outcome (startRun.end, run by
//     a defer, so no exit path can skip it);
//   - taken for the instance (keep: the engine's port lease, its launch
//     directory, the ledger charge, the LMCache port and server, the
//     engine's processes): undone, newest first, when a later step fails
//     (startRun.rollback); when every step succeeded they are handed over
//     to the instance (startRun.handOver), whose record names each one and
//     whose stop (or exit, or recovery that finds it gone) gives them back
//     (instance.release).
//
// Then a failure is recorded the way the failing step asks (startRun.onFail).
// Nothing in a start downloads a model: a model source is fetched before
// the start, with its progress in the events.

// resolved is what a deployment needs before anything is taken: its
// engine, the driver of its family, and its model directory.
type resolved struct {
	eng      *structs.EngineRecord
	drv      sdk.Driver
	modelDir string
}

// resolve finds a deployment's engine, driver and model, and checks the
// driver serves its API; needModel is false for a validation of a spec
// that names no model yet. ValidateDeployment and every start use it.
func (m *Manager) resolve(ctx context.Context, spec *structs.Deployment, needModel bool) (*resolved, error) {
	eng, err := m.resolveEngine(spec.Engine)
	if err != nil {
		return nil, err
	}
	desc, err := m.cfg.Drivers.Describe(ctx, eng.Family)
	if err != nil {
		return nil, driverErr(err, "describe driver")
	}
	if !contains(desc.Capabilities.APIs, spec.API) {
		return nil, structs.Errf(structs.CodeCapabilityMissing+":"+structs.Code(spec.API),
			"the %s engine cannot serve api %q (it serves %s)", eng.Family, spec.API, strings.Join(desc.Capabilities.APIs, ", "))
	}
	if spec.LMCache == structs.LMCacheRequired && !desc.Capabilities.LMCache {
		return nil, structs.Errf(structs.CodeCapabilityMissing+":lmcache",
			"lmcache = \"required\", but the %s driver cannot run a private LMCache (vLLM 0.32 and SGLang 0.5.22 can)", eng.Family)
	}
	r := &resolved{eng: eng}
	if needModel || spec.Model.Path != "" {
		if r.modelDir, err = m.resolveModel(spec); err != nil {
			return nil, err
		}
	}
	if r.drv, err = m.cfg.Drivers.Driver(ctx, eng.Family); err != nil {
		return nil, err
	}
	return r, nil
}

// startRun is one start of an instance as it goes through its steps.
type startRun struct {
	in    *instance
	m     *Manager
	ctx   context.Context
	why   string
	evict bool

	dr   *structs.DeploymentRecord
	spec *structs.Deployment
	*resolved
	placer Placer

	port        int
	lmcachePort int
	server      *structs.LaunchRecord // the instance's LMCache server, nil for none
	launchID    string
	launchDir   string
	recorded    bool // the launch is in the store: its directory stays
	// reserved: the ledger granted this start (a parked charge was then
	// replaced); keptServer: it reuses the LMCache server kept at a park.
	reserved, keptServer bool
	// charge writes the grant's charge record with the launch record (a
	// ChargeRecorder's); nil when Reserve wrote it.
	charge       chargeWrite
	installation *sdk.Installation
	host         *sdk.HostPolicy
	pdep         *sdk.Deployment
	lctx         *sdk.LaunchContext
	plan         *sdk.PlanResponse
	grant        *Grant
	engineKey    string
	adminKey     string
	resp         *sdk.StartResponse
	probe        *sdk.ProbeResponse

	// waitCtx ends the waits an operator's stop may cut short (a start
	// slot, the readiness probe): abortStartup cancels it.
	waitCtx context.Context

	// held are what the steps hold for the duration of the start (take);
	// kept are what they took for the instance (keep). See the top of the
	// file.
	held []taken
	kept []taken
	// unproven: the rollback could not prove the launch's processes gone;
	// what they hold stays with the instance (unprovenLaunch).
	unproven bool
	// onFail records a failed step after the undo: the default keeps the
	// error as the instance's last error.
	onFail func(err error) error
}

// taken is one thing a step took, named for the logs, and how to give it
// back.
type taken struct {
	what     string
	giveBack func()
}

// startStep is one step; it returns the step's error.
type startStep struct {
	name string
	run  func(r *startRun) error
}

// startSteps are a start's steps, in order.
var startSteps = []startStep{
	{"resolve", (*startRun).resolveStep},
	{"lease a port", (*startRun).leasePort},
	{"plan", (*startRun).firstPlan},
	{"lease the LMCache port", (*startRun).leaseLMCachePort},
	{"reserve memory", (*startRun).reserve},
	{"plan with the grant", (*startRun).replan},
	{"record the launch", (*startRun).record},
	{"launch", (*startRun).launch},
	{"probe", (*startRun).probeReady},
}

// start launches the engine and waits for readiness (or wakes a parked
// instance), for the lane's command c. With c.evict, a start that does not
// fit makes room by parking or stopping idle models.
func (in *instance) start(c *command) error {
	why, evict := c.why, c.evict
	rec := in.snapshot()
	switch rec.State {
	case structs.StateReady:
		return nil
	case structs.StateParked:
		if !parkedWithLMCacheOnly(rec) {
			return in.wake(c)
		}
		// Parked with its engine stopped: a new engine launch, connected
		// to the LMCache server the instance kept.
	case structs.StateStopped, structs.StateFailed:
	default:
		if rec.State == structs.StateStopping {
			return structs.Errf(structs.CodeStillStopping, "instance %s is still stopping", in.id)
		}
		return structs.Errf(structs.CodeConflict, "instance %s is %s", in.id, rec.State)
	}
	dr, ok := in.m.spec(in.dep)
	if !ok {
		return structs.Errf(structs.CodeNotFound, "no deployment %s", in.dep)
	}
	r := &startRun{in: in, m: in.m, ctx: in.m.ctx, why: why, evict: evict, dr: &dr, spec: &dr.Spec, placer: in.m.cfg.Placer}
	if r.placer == nil {
		r.placer = noPlacer{}
	}
	if err := r.run(); err != nil {
		return r.onFail(err)
	}
	return r.ready()
}

// run runs the steps; a failing step rolls back what the steps took for
// the instance. Either way, what the start held is given back before the
// outcome is recorded: an instance seen ready or failed holds no start
// slot.
func (r *startRun) run() error {
	r.waitCtx = r.in.beginStartup()
	// IMPORTANT: what the start holds goes back when it ends, on success
	// too (a start slot kept by a successful start is lost for good: the
	// family's ninth start would wait for ever).
	defer r.end()
	for _, s := range startSteps {
		r.onFail = r.keepLastError
		if err := s.run(r); err != nil {
			r.rollback()
			if r.unproven {
				r.onFail = r.unprovenLaunch
				return err
			}
			r.unpark()
			return err
		}
	}
	r.handOver()
	return nil
}

// unprovenLaunch records a failed start whose processes could not be
// proven gone: the instance is stopping, with the launch's record, its
// port and its memory charge, and its stop is retried until it proves
// them gone (a role restart finishes it too).
func (r *startRun) unprovenLaunch(err error) error {
	e := structs.AsError(err)
	msg := e.Message + "; its processes could not be proven gone: the instance keeps its memory and port until a stop proves it"
	_ = r.in.transition(structs.StateStopping, "start failed", func(rec *structs.InstanceRecord) {
		rec.LastError = &structs.ErrorRecord{Code: e.Code, Message: msg, At: r.m.cfg.Now().UTC()}
		rec.Phase = ""
		rec.Endpoint = nil
	})
	r.m.retryStop(r.in)
	return err
}

// take registers what a step holds for the duration of the start only: it
// is given back when the start ends, whatever the outcome.
func (r *startRun) take(what string, giveBack func()) {
	r.held = append(r.held, taken{what: what, giveBack: giveBack})
}

// keep registers what a step took for the instance: undone if a later step
// fails, handed over to the instance when the start succeeds.
func (r *startRun) keep(what string, undo func()) {
	r.kept = append(r.kept, taken{what: what, giveBack: undo})
}

// rollback undoes everything the steps took for the instance, newest
// first, once. IMPORTANT: when the launch's processes cannot be proven
// gone, the unwinding stops there: the memory charge, the port, the
// LMCache server and the launch's record stay with the instance, which a
// later stop ends (unprovenLaunch); releasing them would leave an engine
// running outside the ledger, on a port leased to the next launch.
func (r *startRun) rollback() {
	for i := len(r.kept) - 1; i >= 0; i-- {
		r.kept[i].giveBack()
		if r.unproven {
			r.m.logger.Warn("a failed start's processes could not be proven gone; the instance keeps what they hold until a stop proves it",
				"instance", r.in.id, "kept", names(r.kept[:i]))
			break
		}
	}
	r.kept = nil
}

// handOver gives the instance what the steps took for it: the launch
// stands, and its record names the port, the launch directory, the LMCache
// server and the processes, and the ledger its charge; the instance's stop
// gives them back (instance.release), the start undoes nothing more.
func (r *startRun) handOver() {
	r.m.logger.Debug("start handed over to the instance", "instance", r.in.id, "kept", names(r.kept))
	r.kept = nil
}

// names are what the taken things are.
func names(list []taken) []string {
	out := make([]string, len(list))
	for i, k := range list {
		out[i] = k.what
	}
	return out
}

// end gives back what the start held (newest first) and ends its
// cancellable waits; it runs once the start ended, whatever the outcome.
func (r *startRun) end() {
	for i := len(r.held) - 1; i >= 0; i-- {
		r.held[i].giveBack()
	}
	r.held = nil
	r.in.charging.Store(false)
	r.in.endStartup()
}

// keepLastError records err as the instance's last error.
func (r *startRun) keepLastError(err error) error {
	e := structs.AsError(err)
	r.in.update(func(rec *structs.InstanceRecord) {
		rec.LastError = &structs.ErrorRecord{Code: e.Code, Message: e.Message, At: r.m.cfg.Now().UTC()}
	})
	return err
}

// asIs returns err unrecorded (the instance's record says why already).
func asIs(err error) error { return err }

// launchFailed ends a launch that failed after it was recorded: the
// instance is failed with the error (internal errors become launch_failed).
func (r *startRun) launchFailed(what string, clearEndpoint bool) func(error) error {
	return func(err error) error {
		e := structs.AsError(driverErr(err, what))
		switch e.Code {
		case structs.CodeInternal, structs.CodeInstanceNotFound, structs.CodeDriverError:
			// The launch failed: the driver's own account is in the
			// message (a driver relaunched meanwhile no longer knows it).
			e.Code = structs.CodeLaunchFailed
		}
		_ = r.in.transition(structs.StateFailed, e.Message, func(rec *structs.InstanceRecord) {
			rec.Reason = structs.ReasonStartFailed
			if r.in.stopAsked.Load() {
				rec.Reason = structs.ReasonOperator // a stop ended the start: no failure of the engine
			}
			rec.LastError = &structs.ErrorRecord{Code: e.Code, Message: e.Message, At: r.m.cfg.Now().UTC()}
			rec.Phase = ""
			if clearEndpoint {
				rec.Endpoint = nil
			}
		})
		return e
	}
}

// resolveStep finds the engine, driver and model, and takes a start slot
// of the driver's family.
func (r *startRun) resolveStep() error {
	res, err := r.m.resolve(r.ctx, r.spec, true)
	if err != nil {
		return err
	}
	r.resolved = res
	release, err := r.in.acquire(r.waitCtx, res.eng.Family)
	if err != nil {
		r.onFail = asIs
		if r.in.stopAsked.Load() && r.m.ctx.Err() == nil {
			return structs.Errf(structs.CodeLaunchFailed, "stopped by an operator before it began (it waited for a start slot of the %s driver)", res.eng.Family)
		}
		return structs.Errf(structs.CodeShuttingDown, "shutting down before the start began")
	}
	r.take("a start slot of "+res.eng.Family, release)
	return nil
}

// leasePort leases the engine's loopback port and creates its launch
// directory.
func (r *startRun) leasePort() error {
	m, in := r.m, r.in
	port, err := m.cfg.Ports.Lease(in.id)
	if err != nil {
		return err
	}
	r.port = port
	r.keep("engine port", func() { m.cfg.Ports.Release(port) })
	r.launchID = randomID()
	r.launchDir = filepath.Join(m.cfg.Host.StateDir, "launches", in.dep, fmt.Sprintf("%d-%s", in.idx, r.launchID))
	if err := os.MkdirAll(r.launchDir, 0o700); err != nil {
		code := structs.CodeInternal
		if structs.StorageRefused(err) {
			code = structs.CodeStoreUnavailable
		}
		return structs.Wrap(code, err, "create launch directory")
	}
	r.keep("launch directory", func() {
		if !r.recorded {
			_ = os.RemoveAll(r.launchDir)
		}
	})
	r.installation = ToInstallation(r.eng)
	r.host = m.hostPolicy(r.eng)
	r.pdep = ToDeployment(r.spec, r.dr.Revision, r.modelDir)
	r.pdep.EngineConfigJSON = familyConfig(r.spec, r.eng.Family)
	r.lctx = &sdk.LaunchContext{Port: int32(port), LaunchDir: r.launchDir, InstanceID: in.id, LaunchID: r.launchID}
	return nil
}

// planOnce asks the driver for the launch plan.
func (r *startRun) planOnce() error {
	plan, err := r.drv.Plan(r.ctx, &sdk.PlanRequest{Installation: *r.installation, Deployment: *r.pdep, Host: *r.host, Launch: *r.lctx})
	if err != nil {
		return driverErr(err, "plan")
	}
	if err := refusalErr(plan.Refusals); err != nil {
		return err
	}
	r.plan = plan
	return nil
}

// firstPlan validates the launch and gets the memory hints.
func (r *startRun) firstPlan() error { return r.planOnce() }

// reserve charges the memory ledger, evicting idle models where allowed.
func (r *startRun) reserve() error {
	in := r.in
	cr, deferred := r.placer.(ChargeRecorder)
	err := r.m.withRoom(r.ctx, in, r.evict, func() error {
		var rerr error
		req := Reservation{
			Owner: in.id, Deployment: r.spec, Revision: r.dr.Revision, Engine: r.eng, Hints: &r.plan.Hints, Residency: r.plan.Residency,
		}
		if deferred {
			// The charge record goes with the launch record (record).
			r.grant, rerr = cr.ReserveUnrecorded(r.ctx, req)
		} else {
			r.grant, rerr = r.placer.Reserve(r.ctx, req)
		}
		if rerr == nil {
			// Charged, not yet recorded: a switch waits for the record
			// (end clears it).
			in.charging.Store(true)
		}
		return rerr
	})
	if err != nil {
		return err
	}
	r.reserved = true
	if deferred {
		r.charge = func(put func(map[string]string) error) error { return cr.WithCharge(in.id, put) }
	}
	r.keep("ledger charge", func() { r.placer.Release(in.id) })
	return nil
}

// replan plans again with what the grant placed (devices, bytes, host
// variables); a grant that places nothing keeps the first plan.
func (r *startRun) replan() error {
	g := r.grant
	if g == nil || (g.DeviceBytes <= 0 && len(g.DeviceUUIDs) == 0 && len(g.Env) == 0) {
		if r.lmcachePort != 0 {
			return r.planOnce() // renders the LMCache server on its port
		}
		return nil
	}
	r.lctx.DeviceUUIDs = g.DeviceUUIDs
	r.lctx.DeviceBytes = g.DeviceBytes
	r.lctx.DeviceTotalBytes = g.DeviceTotal
	r.lctx.KVCacheBytes = g.KVBytes
	if len(g.Env) > 0 {
		if r.host.HostEnv == nil {
			r.host.HostEnv = map[string]string{}
		}
		for k, v := range g.Env {
			r.host.HostEnv[k] = v
		}
	}
	return r.planOnce()
}

// record stores the launch before the engine exists. IMPORTANT: the launch
// is recorded before the engine exists, and its process identities as soon
// as it does (launch); an engine whose record cannot be written is never
// left running (after a restart it would hold memory outside the ledger).
// The record, its event and the grant's charge record (ChargeRecorder) are
// one synced write: the only one between the plan and the launch.
func (r *startRun) record() error {
	m := r.m
	r.engineKey, r.adminKey = randomKey(), randomKey()
	plan := r.plan
	launch := &structs.LaunchRecord{
		LaunchID: r.launchID, Port: r.port, LMCachePort: r.lmcachePort, LaunchDir: r.launchDir, StartedAt: m.cfg.Now().UTC(),
		DeviceUUIDs: r.lctx.DeviceUUIDs, EngineKey: r.engineKey, AdminKey: r.adminKey,
		Argv: plan.Argv, Env: plan.Env,
	}
	err := r.in.transitionCharged(structs.StateStarting, r.why, func(rec *structs.InstanceRecord) {
		rec.Launch = launch
		rec.LMCache = r.server
		rec.Endpoint = nil
		rec.Engine = r.eng.Name
		rec.Driver = r.eng.Family
		rec.Revision = r.dr.Revision
		rec.Generation++
		rec.Residency = plan.Residency
		rec.Parsers = nil
		if p := plan.Parsers; p != (sdk.Parsers{}) {
			rec.Parsers = &structs.Parsers{ToolCall: p.ToolCall, Reasoning: p.Reasoning, Provenance: p.Provenance}
		}
		rec.LastError = nil
		rec.Released = ""
		rec.Phase = ledger.PhaseStartup
	}, r.charge)
	if err != nil {
		r.onFail = r.unrecorded
		return err
	}
	r.recorded = true
	serverDir := ""
	if r.server != nil {
		serverDir = r.server.LaunchDir
	}
	r.in.pruneLaunchDirs(r.launchDir, serverDir)
	return nil
}

// unrecorded fails the instance when a record could not be stored.
func (r *startRun) unrecorded(err error) error {
	if structs.HasCode(err, structs.CodeStoreUnavailable) {
		r.in.unrecorded(err)
	}
	return err
}

// launch starts the engine through the driver and records its process
// identities.
func (r *startRun) launch() error {
	// A failed Start may still have spawned something: prove it gone.
	r.keep("engine processes", func() {
		if resp := r.in.cleanupLaunch(r.drv, nil); resp == nil || !resp.Gone {
			r.unproven = true
		}
	})
	resp, err := r.drv.Start(r.ctx, &sdk.StartRequest{
		Installation: *r.installation, Deployment: *r.pdep, Host: *r.host, Launch: *r.lctx, Plan: *r.plan,
		EngineKey: r.engineKey, AdminKey: r.adminKey,
	})
	if err != nil {
		r.onFail = r.launchFailed("start engine", false)
		return err
	}
	r.resp = resp
	if err := r.in.update(func(rec *structs.InstanceRecord) {
		rec.Launch.Pgid = int(resp.Launch.Pgid)
		rec.Launch.Processes = fromLaunch(&resp.Launch)
		if s := resp.LMCacheServer; s != nil && rec.LMCache != nil {
			rec.LMCache.Pgid = int(s.Pgid)
			rec.LMCache.Processes = fromLaunch(s)
		}
	}); err != nil {
		r.onFail = func(err error) error { r.in.unrecorded(err); return err }
		return err
	}
	if po, ok := r.placer.(ProcessObserver); ok {
		po.Launched(r.in.id, int(resp.Launch.Pgid), fromLaunch(&resp.Launch))
	}
	return nil
}

// probeReady waits for the engine's readiness within its startup deadline.
func (r *startRun) probeReady() error {
	deadline := r.plan.StartupTimeout
	if r.spec.Timeouts.Initialize > 0 {
		deadline = r.spec.Timeouts.Initialize.D()
	}
	if deadline <= 0 {
		deadline = r.m.cfg.DefaultStartupTimeout
	}
	// An operator's stop ends the wait (waitCtx): it must not wait out a
	// load.
	pctx, cancel := context.WithTimeout(r.waitCtx, deadline+10*time.Second)
	in := r.in
	probe, err := r.drv.Probe(pctx, &sdk.ProbeRequest{InstanceID: r.in.id, Kind: sdk.ProbeKindReadiness, Deadline: deadline})
	cancel()
	if err == nil && !probe.Ready {
		err = probeFailure(probe, deadline)
	}
	if err != nil && in.stopAsked.Load() {
		err = structs.Errf(structs.CodeLaunchFailed, "stopped by an operator before it was ready")
	}
	if err != nil {
		r.onFail = r.launchFailed("readiness", true)
		return err
	}
	r.probe = probe
	return nil
}

// ready makes the instance ready: its endpoint published, its ledger phase
// ready, its monitor started.
func (r *startRun) ready() error {
	m, in := r.m, r.in
	ep := toEndpoint(&r.probe.Endpoint)
	if ep == nil {
		ep = toEndpoint(&r.resp.Endpoint)
	}
	// The ledger's charge moves to ready before the instance serves; what
	// the placer writes for it (its charge record, the startup peak) waits
	// until the route table has the instance: a request waits for the
	// route, not for those writes.
	record := func() {}
	var err error
	if pr, ok := r.placer.(PhaseRecorder); ok {
		record, err = pr.PhaseThen(in.id, ledger.PhaseReady)
	} else {
		err = r.placer.Phase(in.id, ledger.PhaseReady)
	}
	if err != nil {
		m.logger.Warn("ledger phase change failed", "instance", in.id, "error", err)
	}
	defer record()
	if err := in.transition(structs.StateReady, r.why, func(rec *structs.InstanceRecord) {
		rec.Endpoint = ep
		if r.probe.Canary != "" && rec.Canary == "" {
			rec.Canary = r.probe.Canary
		}
		rec.Phase = ledger.PhaseReady
		rec.Attempts = 0
		rec.LastUsedAt = m.cfg.Now().UTC()
	}); err != nil {
		return err
	}
	in.startMonitor(r.drv)
	return nil
}
