// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package lifecycle owns the instance state machine: deploy, start, stop,
// recovery after a restart, and (with the ledger) parking, waking and
// switching. Each instance has one owner goroutine (its lane) that performs
// at most one effect at a time; effects on different instances run
// concurrently up to a bound. Every transition is checked against the table
// in states.go and journaled in the store.
package lifecycle

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/capyctl/capyctl/core/models"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk"
	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
)

// Store is the part of the store the lifecycle needs.
type Store interface {
	ListDeployments() ([]structs.DeploymentRecord, error)
	PutDeployment(*structs.DeploymentRecord) error
	DeleteDeployment(name string) error
	AllInstances() ([]structs.InstanceRecord, error)
	PutInstance(*structs.InstanceRecord) error
	DeleteInstance(dep string, idx int) error
	GetEngine(name string) (*structs.EngineRecord, error)
	ListEngines() ([]structs.EngineRecord, error)
	AppendEvent(*structs.Event) (uint64, error)
}

// DriverSource hands out drivers by family (the plugin manager).
type DriverSource interface {
	Driver(ctx context.Context, family string) (sdk.Driver, error)
	Describe(ctx context.Context, family string) (*pb.DescribeResponse, error)
}

// Host describes the machine the lifecycle runs engines on.
type Host struct {
	Name       string
	StateDir   string
	ModelsRoot string
	// Policy is what the host allows and sets for every engine.
	Policy *pb.HostPolicy
}

// Config configures a Manager.
type Config struct {
	Store   Store
	Drivers DriverSource
	Ports   *PortPool
	Host    Host
	// Placer reserves memory for starts (the ledger); nil admits every start.
	Placer Placer
	Logger hclog.Logger
	// LivenessInterval is how often a ready engine's process is checked
	// (default 500ms): an engine that dies is noticed within a second.
	LivenessInterval time.Duration
	// MaxConcurrentEffects bounds the starts running at once per driver
	// family (default 8): a family whose driver hangs holds only its own
	// slots, never another family's.
	MaxConcurrentEffects int
	// StopGrace is how long an engine may take to exit after SIGTERM
	// (default 15s).
	StopGrace time.Duration
	// DefaultStartupTimeout bounds readiness when neither the deployment nor
	// the driver's plan gives one (default 10m).
	DefaultStartupTimeout time.Duration
	// Now is the clock (tests inject one).
	Now func() time.Time
	// DrainTimeout bounds how long a victim or a parking instance waits for
	// its requests to end (default 30s); past it the switch or park fails
	// and the instance serves again.
	DrainTimeout time.Duration
	// AdmissionWindow is how long the last ready instance of a deployment
	// keeps admitting before a switch drains it (default 2s, ends early once
	// it is idle).
	AdmissionWindow time.Duration
	// RetryBudget is how many starts an instance of a running deployment
	// attempts before it stays failed (default 3); RetryCooldown is the first
	// cooldown, doubled each time (default 30s).
	RetryBudget   int
	RetryCooldown time.Duration
	// ReadyIdleTimeout and ParkedIdleTimeout are the role's defaults for
	// deployments that set none (0 = off).
	ReadyIdleTimeout  time.Duration
	ParkedIdleTimeout time.Duration
	// IdleCheckInterval is how often idle timers are checked (default 1s).
	IdleCheckInterval time.Duration
}

// Manager is the lifecycle of every deployment on this role.
type Manager struct {
	cfg    Config
	logger hclog.Logger
	// slots bound concurrent starts per driver family (startSlots).
	slotsMu sync.Mutex
	slots   map[string]chan struct{}

	mu          sync.Mutex
	deployments map[string]*deployment
	byID        map[string]*instance
	routes      atomic.Pointer[RouteTable]
	// routesMu serialises rebuildRoutes: a table built from older
	// snapshots must never be published after a newer one.
	routesMu sync.Mutex
	requests requestsHolder
	// switchMu serialises switches: one eviction plan at a time on a host.
	switchMu sync.Mutex

	ctx    context.Context
	cancel context.CancelFunc
	// wg counts every goroutine the manager starts (lanes, monitors,
	// timers, background actions); Close waits for it. closing, under
	// goMu, refuses new ones once Close began (a WaitGroup must not grow
	// while it is waited on).
	goMu    sync.Mutex
	closing bool
	wg      sync.WaitGroup
}

// goTracked runs fn on a goroutine Close waits for; once Close began it
// runs nothing and returns false.
func (m *Manager) goTracked(fn func()) bool {
	m.goMu.Lock()
	defer m.goMu.Unlock()
	if m.closing {
		return false
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		fn()
	}()
	return true
}

// deployment is the in-memory state of one deployment.
type deployment struct {
	rec        structs.DeploymentRecord
	instances  []*instance
	activation *activation
}

// activation is one deployment-level activation that concurrent requests
// join (a model is never started twice for them).
type activation struct {
	done chan struct{}
	err  error
}

// New returns a Manager; call Start to load the store and recover.
func New(cfg Config) *Manager {
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.LivenessInterval == 0 {
		cfg.LivenessInterval = 500 * time.Millisecond
	}
	if cfg.MaxConcurrentEffects == 0 {
		cfg.MaxConcurrentEffects = 8
	}
	if cfg.StopGrace == 0 {
		cfg.StopGrace = 15 * time.Second
	}
	if cfg.DefaultStartupTimeout == 0 {
		cfg.DefaultStartupTimeout = 10 * time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = 30 * time.Second
	}
	if cfg.AdmissionWindow == 0 {
		cfg.AdmissionWindow = 2 * time.Second
	}
	if cfg.RetryBudget == 0 {
		cfg.RetryBudget = 3
	}
	if cfg.RetryCooldown == 0 {
		cfg.RetryCooldown = 30 * time.Second
	}
	if cfg.IdleCheckInterval == 0 {
		cfg.IdleCheckInterval = time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &Manager{
		cfg:         cfg,
		logger:      cfg.Logger.Named("lifecycle"),
		slots:       map[string]chan struct{}{},
		deployments: map[string]*deployment{},
		byID:        map[string]*instance{},
		ctx:         ctx,
		cancel:      cancel,
	}
	m.routes.Store(&RouteTable{byRoute: map[string]*Route{}})
	return m
}

// Start loads deployments and instances from the store and re-attaches to
// every recorded engine (recovery after a restart). Engines are never
// stopped by a role restart.
func (m *Manager) Start(ctx context.Context) error {
	deps, err := m.cfg.Store.ListDeployments()
	if err != nil {
		return fmt.Errorf("load deployments: %w", err)
	}
	insts, err := m.cfg.Store.AllInstances()
	if err != nil {
		return fmt.Errorf("load instances: %w", err)
	}
	byDep := map[string][]*structs.InstanceRecord{}
	for i := range insts {
		r := &insts[i]
		byDep[r.Deployment] = append(byDep[r.Deployment], r)
	}
	m.mu.Lock()
	for i := range deps {
		rec := &deps[i]
		d := &deployment{rec: *rec}
		m.deployments[rec.Name] = d
		recorded := map[int]*structs.InstanceRecord{}
		for _, r := range byDep[rec.Name] {
			recorded[r.Index] = r
		}
		n := rec.Spec.Instances
		for idx := range recorded {
			if idx+1 > n {
				n = idx + 1
			}
		}
		for i := 0; i < n; i++ {
			ir := recorded[i]
			if ir == nil {
				ir = m.newInstanceRecord(rec, i)
			}
			d.instances = append(d.instances, m.newInstance(ir))
		}
	}
	m.mu.Unlock()
	m.rebuildRoutes()

	// Recover every instance that may hold processes.
	var wg sync.WaitGroup
	for _, in := range m.allInstances() {
		rec := in.snapshot()
		if rec.Launch == nil || !holdsProcesses(rec.State) {
			if rec.State != structs.StateStopped && rec.State != structs.StateFailed {
				_ = in.do(ctx, cmdSettleStopped, "recorded without a launch")
			}
			continue
		}
		if rec.Launch.Port != 0 {
			m.cfg.Ports.Claim(rec.Launch.Port, rec.ID())
		}
		wg.Add(1)
		go func(in *instance) {
			defer wg.Done()
			if err := in.do(ctx, cmdRecover, "role restart"); err != nil {
				m.logger.Warn("recovery left an instance unsettled", "instance", in.id, "error", err)
			}
		}(in)
	}
	wg.Wait()

	m.goTracked(m.runIdleTimers)

	// Deployments an operator started come back up.
	for _, d := range m.snapshotDeployments() {
		if d.rec.Desired == structs.DesiredRunning {
			m.startAll(d.rec.Name, "role restart (desired running)")
		}
	}
	return nil
}

// Close stops the lanes, monitors, timers and background actions, and
// returns once every goroutine the manager started has ended; engines keep
// running.
func (m *Manager) Close() {
	m.goMu.Lock()
	m.closing = true
	m.goMu.Unlock()
	m.cancel()
	for _, in := range m.allInstances() {
		in.close()
	}
	m.wg.Wait()
}

// StopAllEngines stops every running instance (dev mode's Ctrl-C); it does
// not change any deployment's desired state.
func (m *Manager) StopAllEngines(ctx context.Context) {
	var wg sync.WaitGroup
	for _, in := range m.allInstances() {
		wg.Add(1)
		go func(in *instance) {
			defer wg.Done()
			_ = in.do(ctx, cmdStop, "role shutdown")
		}(in)
	}
	wg.Wait()
}

// RecoverFamily re-attaches every instance of a driver family, after the
// plugin manager relaunched that driver.
func (m *Manager) RecoverFamily(family string) {
	for _, in := range m.allInstances() {
		rec := in.snapshot()
		if rec.Driver != family || rec.Launch == nil || !holdsProcesses(rec.State) {
			continue
		}
		m.goTracked(func() {
			ctx, cancel := context.WithTimeout(m.ctx, 2*time.Minute)
			defer cancel()
			if err := in.do(ctx, cmdRehandle, "driver relaunched"); err != nil {
				m.logger.Warn("could not re-attach after a driver relaunch", "instance", in.id, "error", err)
			}
		})
	}
}

// ----------------------------------------------------------------- deploy

// DeployOptions are the choices of a deploy.
type DeployOptions struct {
	// Activate starts the deployment once written (desired running).
	Activate bool
	// ExpectedRevision must equal the current revision for an update (0 for
	// a create, or to skip the check).
	ExpectedRevision uint64
	// Validate runs the driver's Plan as a dry run before writing.
	Validate func(ctx context.Context, spec *structs.Deployment) error
}

// Deploy creates a deployment or writes a new revision of it.
func (m *Manager) Deploy(ctx context.Context, spec *structs.Deployment, opts DeployOptions) (*structs.DeploymentRecord, bool, error) {
	if opts.Validate != nil {
		if err := opts.Validate(ctx, spec); err != nil {
			return nil, false, err
		}
	}
	now := m.cfg.Now().UTC()
	m.mu.Lock()
	d, exists := m.deployments[spec.Name]
	if exists && opts.ExpectedRevision != 0 && d.rec.Revision != opts.ExpectedRevision {
		cur := d.rec.Revision
		m.mu.Unlock()
		return nil, false, structs.Errf(structs.CodeRevisionConflict,
			"deployment %s is at revision %d, not %d", spec.Name, cur, opts.ExpectedRevision).
			WithDetail("current_revision", cur)
	}
	if !exists && opts.ExpectedRevision > 1 {
		m.mu.Unlock()
		return nil, false, structs.Errf(structs.CodeNotFound, "deployment %s does not exist", spec.Name)
	}
	for name, other := range m.deployments {
		if name == spec.Name {
			continue
		}
		for _, r := range other.rec.Spec.Routes {
			for _, mine := range spec.Routes {
				if r == mine {
					m.mu.Unlock()
					return nil, false, structs.Errf(structs.CodeConflict,
						"route %q is already served by deployment %s", r, name)
				}
			}
		}
	}
	rec := structs.DeploymentRecord{Name: spec.Name, Spec: *spec, CreatedAt: now, UpdatedAt: now, Desired: structs.DesiredOnDemand}
	var old []*instance
	if exists {
		rec.Revision = d.rec.Revision + 1
		rec.CreatedAt = d.rec.CreatedAt
		rec.Desired = d.rec.Desired
		if rec.Desired == structs.DesiredStopped && opts.Activate {
			rec.Desired = structs.DesiredRunning
		}
		old = d.instances
	} else {
		rec.Revision = 1
	}
	if opts.Activate {
		rec.Desired = structs.DesiredRunning
	}
	if spec.Lifecycle.Activation == structs.ActivationExplicit && rec.Desired == structs.DesiredOnDemand {
		rec.Desired = structs.DesiredStopped
	}
	m.mu.Unlock()

	// A new revision replaces the running instances: stop the old ones first.
	for _, in := range old {
		if err := in.do(ctx, cmdStop, fmt.Sprintf("revision %d replaces %d", rec.Revision, rec.Revision-1)); err != nil {
			return nil, false, err
		}
	}
	if err := m.cfg.Store.PutDeployment(&rec); err != nil {
		return nil, false, structs.Wrap(structs.CodeInternal, err, "store deployment")
	}
	m.mu.Lock()
	if exists {
		for _, in := range old {
			delete(m.byID, in.id)
			in.close()
		}
	}
	nd := &deployment{rec: rec}
	for i := 0; i < spec.Instances; i++ {
		ir := m.newInstanceRecord(&rec, i)
		if exists {
			for _, in := range old {
				if in.idx == i {
					prev := in.snapshot()
					ir.Attempts = 0
					ir.LastError = prev.LastError
					ir.Generation = prev.Generation
				}
			}
		}
		if err := m.cfg.Store.PutInstance(ir); err != nil {
			m.mu.Unlock()
			return nil, false, structs.Wrap(structs.CodeInternal, err, "store instance")
		}
		nd.instances = append(nd.instances, m.newInstance(ir))
	}
	if exists {
		for _, in := range old {
			if in.idx >= spec.Instances {
				_ = m.cfg.Store.DeleteInstance(spec.Name, in.idx)
			}
		}
	}
	m.deployments[spec.Name] = nd
	m.mu.Unlock()
	kind := "deployment_created"
	if exists {
		kind = "deployment_revised"
	}
	m.event(kind, spec.Name, "", map[string]any{"revision": rec.Revision, "desired": rec.Desired})
	m.rebuildRoutes()
	if rec.Desired == structs.DesiredRunning {
		m.startAll(spec.Name, "deploy --activate")
	}
	return &rec, !exists, nil
}

// ----------------------------------------------------------------- actions

// StartDeployment marks a deployment running and starts (or wakes) every
// instance. With wait it returns when all are ready or one gave up. Without
// evict, a start that does not fit is refused capacity_blocked; with it,
// idle models are parked or stopped to make room.
func (m *Manager) StartDeployment(ctx context.Context, name string, wait bool, evict ...bool) error {
	ev := len(evict) > 0 && evict[0]
	return m.startDeployment(ctx, name, wait, ev)
}

func (m *Manager) startDeployment(ctx context.Context, name string, wait, evict bool) error {
	d, err := m.setDesired(name, structs.DesiredRunning)
	if err != nil {
		return err
	}
	if !wait {
		m.startAllEvict(name, "operator start", evict)
		return nil
	}
	errs := make(chan error, len(d))
	for _, in := range d {
		go func(in *instance) {
			errs <- in.send(ctx, &command{kind: cmdStart, why: "operator start", evict: evict, done: make(chan error, 1)})
		}(in)
	}
	var first error
	for range d {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// StopDeployment marks a deployment stopped (requests get 409) and stops
// every instance.
func (m *Manager) StopDeployment(ctx context.Context, name string, wait bool) error {
	insts, err := m.setDesired(name, structs.DesiredStopped)
	if err != nil {
		return err
	}
	run := func(ctx context.Context) error {
		var first error
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, in := range insts {
			wg.Add(1)
			go func(in *instance) {
				defer wg.Done()
				if err := in.do(ctx, cmdStop, "operator stop"); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}(in)
		}
		wg.Wait()
		return first
	}
	if wait {
		return run(ctx)
	}
	// The caller's context ends with its answer; the stop goes on.
	m.goTracked(func() { _ = run(m.ctx) })
	return nil
}

// DeleteDeployment stops every instance, proves the processes gone, and
// deletes the deployment.
func (m *Manager) DeleteDeployment(ctx context.Context, name string) error {
	insts, err := m.setDesired(name, structs.DesiredStopped)
	if err != nil {
		return err
	}
	for _, in := range insts {
		if err := in.do(ctx, cmdStop, "delete"); err != nil {
			return err
		}
		if s := in.snapshot().State; s != structs.StateStopped && s != structs.StateFailed {
			return structs.Errf(structs.CodeDeleteRequiresCleanup, "instance %s is still %s", in.id, s)
		}
	}
	m.mu.Lock()
	delete(m.deployments, name)
	for _, in := range insts {
		delete(m.byID, in.id)
	}
	m.mu.Unlock()
	for _, in := range insts {
		in.close()
	}
	if err := m.cfg.Store.DeleteDeployment(name); err != nil {
		return structs.Wrap(structs.CodeInternal, err, "delete deployment")
	}
	m.event("deployment_deleted", name, "", nil)
	m.rebuildRoutes()
	return nil
}

// Activate makes sure a deployment has a ready instance, starting one when
// none is: concurrent callers join the same activation. It returns when an
// instance is ready, the activation failed, or ctx ended (the activation
// itself goes on).
func (m *Manager) Activate(ctx context.Context, name string) error {
	m.mu.Lock()
	d, ok := m.deployments[name]
	if !ok {
		m.mu.Unlock()
		return structs.Errf(structs.CodeUnknownModel, "no deployment %s", name)
	}
	switch d.rec.Desired {
	case structs.DesiredStopped:
		m.mu.Unlock()
		if d.rec.Spec.Lifecycle.Activation == structs.ActivationExplicit {
			return structs.Errf(structs.CodeDeploymentInactive,
				"deployment %s activates only on an operator's start: capyctl start deployment %s", name, name)
		}
		return structs.Errf(structs.CodeDeploymentStopped,
			"deployment %s was stopped by an operator: capyctl start deployment %s", name, name)
	}
	for _, in := range d.instances {
		if in.state() == structs.StateReady {
			m.mu.Unlock()
			// The state changes before the route table is republished:
			// make sure the table the router reads has the instance.
			if r := m.Routes().Lookup(firstRoute(d.rec.Spec, name)); r == nil || len(r.Ready) == 0 {
				m.rebuildRoutes()
			}
			return nil
		}
	}
	act := d.activation
	if act == nil {
		act = &activation{done: make(chan struct{})}
		d.activation = act
		target := pickActivationTarget(d.instances)
		if !m.goTracked(func() { m.runActivation(name, d, act, target) }) {
			act.err = structs.Errf(structs.CodeShuttingDown, "the role is shutting down")
			d.activation = nil
			close(act.done)
		}
	}
	m.mu.Unlock()
	select {
	case <-act.done:
		return act.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// pickActivationTarget prefers a parked instance (wake), then a stopped or
// failed one (start), then one already on its way.
func pickActivationTarget(insts []*instance) *instance {
	rank := func(s structs.InstanceState) int {
		switch s {
		case structs.StateWaking, structs.StateStarting:
			return 0
		case structs.StateParked:
			return 1
		case structs.StateStopped:
			return 2
		case structs.StateFailed:
			return 3
		}
		return 4
	}
	var best *instance
	for _, in := range insts {
		if best == nil || rank(in.state()) < rank(best.state()) {
			best = in
		}
	}
	return best
}

// firstRoute returns a deployment's first public name.
func firstRoute(spec structs.Deployment, name string) string {
	if len(spec.Routes) > 0 {
		return spec.Routes[0]
	}
	return name
}

func (m *Manager) runActivation(name string, d *deployment, act *activation, target *instance) {
	var err error
	if target == nil {
		err = structs.Errf(structs.CodeUnavailable, "deployment %s has no instance", name)
	} else {
		err = target.send(m.ctx, &command{kind: cmdStart, why: "request", evict: true, done: make(chan error, 1)})
	}
	if err != nil {
		ae := structs.AsError(err)
		if ae.Code == structs.CodeInternal || ae.Code == structs.CodeLaunchFailed || ae.Code == structs.CodeStartupTimeout {
			err = &structs.Error{Code: structs.CodeActivationFailed, Message: ae.Message, Details: ae.Details, Cause: err}
		}
	}
	m.mu.Lock()
	act.err = err
	if d.activation == act {
		d.activation = nil
	}
	m.mu.Unlock()
	close(act.done)
}

func (m *Manager) setDesired(name, desired string) ([]*instance, error) {
	m.mu.Lock()
	d, ok := m.deployments[name]
	if !ok {
		m.mu.Unlock()
		return nil, structs.Errf(structs.CodeNotFound, "no deployment %s", name)
	}
	changed := d.rec.Desired != desired
	d.rec.Desired = desired
	d.rec.UpdatedAt = m.cfg.Now().UTC()
	rec := d.rec
	insts := append([]*instance(nil), d.instances...)
	m.mu.Unlock()
	if changed {
		if err := m.cfg.Store.PutDeployment(&rec); err != nil {
			return nil, structs.Wrap(structs.CodeInternal, err, "store deployment")
		}
		m.event("deployment_desired", name, "", map[string]any{"desired": desired})
		m.rebuildRoutes()
	}
	return insts, nil
}

func (m *Manager) startAll(name, why string) { m.startAllEvict(name, why, false) }

// startAllEvict starts every instance of a deployment in the background;
// a failed start of a running deployment is retried (see retryStart).
func (m *Manager) startAllEvict(name, why string, evict bool) {
	m.mu.Lock()
	d, ok := m.deployments[name]
	var insts []*instance
	if ok {
		insts = append(insts, d.instances...)
	}
	m.mu.Unlock()
	for _, in := range insts {
		m.goTracked(func() {
			err := in.send(m.ctx, &command{kind: cmdStart, why: why, evict: evict, done: make(chan error, 1)})
			if err != nil {
				m.logger.Warn("start failed", "instance", in.id, "error", err)
				m.retryStart(in, err, 1)
			}
		})
	}
}

// ----------------------------------------------------------------- views

// DeploymentView is a deployment with its instances, for status and the
// management API.
type DeploymentView struct {
	Record    structs.DeploymentRecord
	Instances []structs.InstanceRecord
}

// Deployment returns one deployment's view.
func (m *Manager) Deployment(name string) (*DeploymentView, error) {
	m.mu.Lock()
	d, ok := m.deployments[name]
	if !ok {
		m.mu.Unlock()
		return nil, structs.Errf(structs.CodeNotFound, "no deployment %s", name)
	}
	v := &DeploymentView{Record: d.rec}
	insts := append([]*instance(nil), d.instances...)
	m.mu.Unlock()
	for _, in := range insts {
		v.Instances = append(v.Instances, in.snapshot())
	}
	return v, nil
}

// Deployments returns every deployment's view, sorted by name.
func (m *Manager) Deployments() []*DeploymentView {
	m.mu.Lock()
	names := make([]string, 0, len(m.deployments))
	for n := range m.deployments {
		names = append(names, n)
	}
	m.mu.Unlock()
	sort.Strings(names)
	out := make([]*DeploymentView, 0, len(names))
	for _, n := range names {
		if v, err := m.Deployment(n); err == nil {
			out = append(out, v)
		}
	}
	return out
}

// Logs returns the redacted tail of an instance's engine output.
func (m *Manager) Logs(ctx context.Context, dep string, idx int, maxBytes int64) (string, bool, error) {
	in, err := m.instance(dep, idx)
	if err != nil {
		return "", false, err
	}
	rec := in.snapshot()
	if rec.Launch == nil {
		return "", false, structs.Errf(structs.CodeNotFound, "instance %s has never launched", in.id)
	}
	drv, err := m.cfg.Drivers.Driver(ctx, rec.Driver)
	if err != nil {
		return "", false, err
	}
	resp, err := drv.Logs(ctx, &pb.LogsRequest{InstanceId: in.id, MaxBytes: maxBytes, LaunchDir: rec.Launch.LaunchDir})
	if err != nil {
		return "", false, driverErr(err, "read engine log")
	}
	return resp.GetText(), resp.GetTruncated(), nil
}

// UsesEngine returns the deployments that name an engine registration.
func (m *Manager) UsesEngine(name string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for n, d := range m.deployments {
		if d.rec.Spec.Engine == name {
			out = append(out, n)
			continue
		}
		for _, in := range d.instances {
			if in.snapshot().Engine == name {
				out = append(out, n)
				break
			}
		}
	}
	sort.Strings(out)
	return out
}

func (m *Manager) instance(dep string, idx int) (*instance, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, ok := m.deployments[dep]
	if !ok {
		return nil, structs.Errf(structs.CodeNotFound, "no deployment %s", dep)
	}
	for _, in := range d.instances {
		if in.idx == idx {
			return in, nil
		}
	}
	return nil, structs.Errf(structs.CodeNotFound, "deployment %s has no instance %d", dep, idx)
}

func (m *Manager) allInstances() []*instance {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*instance
	for _, d := range m.deployments {
		out = append(out, d.instances...)
	}
	return out
}

func (m *Manager) snapshotDeployments() []*deployment {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*deployment, 0, len(m.deployments))
	for _, d := range m.deployments {
		out = append(out, d)
	}
	return out
}

// spec returns the current spec and desired state of a deployment.
func (m *Manager) spec(name string) (structs.DeploymentRecord, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, ok := m.deployments[name]
	if !ok {
		return structs.DeploymentRecord{}, false
	}
	return d.rec, true
}

func (m *Manager) newInstanceRecord(rec *structs.DeploymentRecord, idx int) *structs.InstanceRecord {
	return &structs.InstanceRecord{
		Deployment: rec.Name,
		Index:      idx,
		Revision:   rec.Revision,
		State:      structs.StateStopped,
		Since:      m.cfg.Now().UTC(),
		Host:       m.cfg.Host.Name,
	}
}

// event journals an event; a journal failure is logged, never fatal.
func (m *Manager) event(kind, dep, inst string, payload map[string]any) {
	ev := &structs.Event{At: m.cfg.Now().UTC(), Kind: kind, Deployment: dep, Instance: inst, Payload: payload}
	if _, err := m.cfg.Store.AppendEvent(ev); err != nil {
		m.logger.Warn("could not journal an event", "kind", kind, "error", err)
	}
}

// ----------------------------------------------------------------- helpers

// randomKey returns a fresh secret of 256 bits in hex. IMPORTANT: never
// base64url: a key beginning with "-" reads as an option when an engine
// turns its config file back into arguments (SGLang does).
func randomKey() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

func randomID() string {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// resolveModel returns the model directory of a spec on this host
// (core/models: a local path under the models root, or a Hugging Face
// download, fetched on first use), checked against its content fingerprint.
func (m *Manager) resolveModel(spec *structs.Deployment) (string, error) {
	st := models.NewStore(models.Options{Root: m.cfg.Host.ModelsRoot, StateDir: m.cfg.Host.StateDir})
	r, err := st.Resolve(m.ctx, spec.Model)
	if err != nil {
		return "", err
	}
	if r.Hashed > 0 {
		m.logger.Info("model measured", "deployment", spec.Name, "model_dir", r.Dir, "content_fingerprint", r.Fingerprint, "files_read", r.Hashed, "files_unchanged", r.Reused)
	}
	return r.Dir, nil
}

// driverErr maps a driver error to a product error.
func driverErr(err error, what string) error {
	if err == nil {
		return nil
	}
	var se *structs.Error
	if errors.As(err, &se) {
		return se
	}
	if code := sdk.CodeOf(err); code != "" {
		return &structs.Error{Code: structs.Code(code), Message: fmt.Sprintf("%s: %s", what, err.Error()), Cause: err}
	}
	if errors.Is(err, sdk.ErrNotSupported) {
		return structs.Wrap(structs.CodeUnsupported, err, "%s", what)
	}
	return structs.Wrap(structs.CodeInternal, err, "%s", what)
}

// Journal appends an event about something outside an instance's lane
// (engine registry changes, operator actions).
func (m *Manager) Journal(kind, dep string, payload map[string]any) { m.event(kind, dep, "", payload) }
