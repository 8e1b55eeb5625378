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
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/capyctl/capyctl/core/models"
	"github.com/capyctl/capyctl/core/routes"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk"
)

// Store is the part of the store the lifecycle needs.
type Store interface {
	ListDeployments() ([]structs.DeploymentRecord, error)
	PutDeployment(*structs.DeploymentRecord) error
	DeleteDeployment(name string) error
	AllInstances() ([]structs.InstanceRecord, error)
	PutInstance(*structs.InstanceRecord) error
	// PutInstanceEvent stores a record, the meta values and the event (nil
	// for none) in one synced write.
	PutInstanceEvent(r *structs.InstanceRecord, e *structs.Event, meta map[string]string) error
	DeleteInstance(dep string, idx int) error
	GetEngine(name string) (*structs.EngineRecord, error)
	ListEngines() ([]structs.EngineRecord, error)
	AppendEvent(*structs.Event) (uint64, error)
}

// DriverSource hands out drivers by family (the plugin manager).
type DriverSource interface {
	Driver(ctx context.Context, family string) (sdk.Driver, error)
	Describe(ctx context.Context, family string) (*sdk.DescribeResponse, error)
}

// Host describes the machine the lifecycle runs engines on.
type Host struct {
	Name       string
	StateDir   string
	ModelsRoot string
	// Policy is what the host allows and sets for every engine.
	Policy *sdk.HostPolicy
}

// Config configures a Manager.
type Config struct {
	Store   Store
	Drivers DriverSource
	Ports   *PortPool
	Host    Host
	// Placer reserves memory for starts (the ledger); nil admits every start.
	Placer Placer
	// Requests are the counts of the requests admitted to the instances
	// (the admission controller the router shares); nil counts none.
	Requests Requests
	Logger   hclog.Logger
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
	// StopRetryCooldown is the first wait before a stop whose processes
	// were not proven gone is tried again (default 1s, doubled each time
	// up to a minute).
	StopRetryCooldown time.Duration
	// ReadyIdleTimeout and ParkedIdleTimeout are the role's defaults for
	// deployments that set none (0 = off).
	ReadyIdleTimeout  time.Duration
	ParkedIdleTimeout time.Duration
	// IdleCheckInterval is how often idle timers are checked (default 1s).
	IdleCheckInterval time.Duration
	// Group is what a host knows for its group members; nil on a role
	// that runs no group (standalone).
	Group *GroupSettings
	// Switching is how models that compete for one card take turns
	// (switching.*; zero values take the defaults).
	Switching SwitchingConfig
	// RequestDeadline is the role's request deadline (limits.request_deadline,
	// default 10m). A request's activation waits for room (the switch
	// queue, busy models' turns) at most a request's deadline, the
	// deployment's own when it sets one: past it, no request it could
	// serve is left, and it ends activation_timeout.
	RequestDeadline time.Duration
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
	board       routes.Board
	// records is published whenever an instance's record is written (a
	// transition, a last error, a charge): Changed.
	recordsMu sync.Mutex
	records   chan struct{}
	// routesMu serialises rebuildRoutes: a table built from older
	// snapshots must never be published after a newer one.
	routesMu sync.Mutex
	// switchMu serialises the switches of idle victims (switchIdle): one
	// eviction plan at a time on a host.
	switchMu sync.Mutex
	// switches orders the contenders of switches that wait for busy
	// models' turns (turns.go); stats are the host's switching figures.
	switches switchQueue
	stats    switchStats

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

// New returns a Manager; call Start to load the store and recover.
func New(cfg Config) *Manager {
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Requests == nil {
		cfg.Requests = noRequests{}
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
	if cfg.RequestDeadline == 0 {
		cfg.RequestDeadline = 10 * time.Minute
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
	if cfg.StopRetryCooldown == 0 {
		cfg.StopRetryCooldown = time.Second
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
		switch {
		case rec.LMCache != nil && rec.LMCache.Port != 0:
			m.cfg.Ports.Claim(rec.LMCache.Port, rec.ID()+" lmcache")
		case rec.Launch.LMCachePort != 0:
			m.cfg.Ports.Claim(rec.Launch.LMCachePort, rec.ID()+" lmcache")
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
// not change any deployment's desired state. A start under way stops
// waiting (for a start slot, for readiness) so that the stop behind it
// runs now.
func (m *Manager) StopAllEngines(ctx context.Context) {
	var wg sync.WaitGroup
	for _, in := range m.allInstances() {
		wg.Add(1)
		go func(in *instance) {
			defer wg.Done()
			in.abortStartup()
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
	if _, err := m.cfg.Store.AppendEvent(m.newEvent(kind, dep, inst, payload)); err != nil {
		m.logger.Warn("could not journal an event", "kind", kind, "error", err)
	}
}

// newEvent is an event of the journal, stamped now.
func (m *Manager) newEvent(kind, dep, inst string, payload map[string]any) *structs.Event {
	return &structs.Event{At: m.cfg.Now().UTC(), Kind: kind, Deployment: dep, Instance: inst, Payload: payload}
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
		c := structs.Code(code)
		if !structs.Known(c) {
			// IMPORTANT: a code outside the catalogue never reaches a
			// client (a third-party driver may return any string).
			e := &structs.Error{Code: structs.CodeDriverError, Message: fmt.Sprintf("%s: %s (driver code %s)", what, err.Error(), code), Cause: err}
			return e.WithDetail("driver_code", code)
		}
		return &structs.Error{Code: c, Message: fmt.Sprintf("%s: %s", what, err.Error()), Cause: err}
	}
	if errors.Is(err, sdk.ErrNotSupported) {
		return structs.Wrap(structs.CodeUnsupported, err, "%s", what)
	}
	return structs.Wrap(structs.CodeInternal, err, "%s", what)
}

// Journal appends an event about something outside an instance's lane
// (engine registry changes, operator actions).
func (m *Manager) Journal(kind, dep string, payload map[string]any) { m.event(kind, dep, "", payload) }
