// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package agent wires a role: settings → state directory and credentials →
// store → GPU inventory and ledger → plugin manager → lifecycle → engine
// registry → router → HTTP listeners; it handles signals and shutdown. It
// holds no policy of its own.
package agent

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/capyctl/capyctl/core/admission"
	"github.com/capyctl/capyctl/core/api"
	"github.com/capyctl/capyctl/core/api/dashboard"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/apikeys"
	"github.com/capyctl/capyctl/core/config"
	"github.com/capyctl/capyctl/core/engines"
	"github.com/capyctl/capyctl/core/fleet"
	"github.com/capyctl/capyctl/core/fleet/hostagent"
	"github.com/capyctl/capyctl/core/gpu"
	"github.com/capyctl/capyctl/core/lifecycle"
	"github.com/capyctl/capyctl/core/placement"
	"github.com/capyctl/capyctl/core/pluginmgr"
	"github.com/capyctl/capyctl/core/responses"
	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/runinfo"
	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/core/usage"
	"github.com/capyctl/capyctl/core/version"
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/proc"
)

// Builtins are the driver families compiled into the capyctl binary.
var Builtins = []string{
	structs.FamilyCustom,
	structs.FamilyLlamaCpp,
	structs.FamilyTensorFold,
	structs.FamilyVLLM,
	structs.FamilySGLang,
}

// Settings are a role's effective settings (core/config produces them).
type Settings struct {
	Role             string
	StateDir         string
	Listen           string
	ManagementListen string
	PluginDir        string
	ModelsRoot       string
	EnginePorts      string
	Hostname         string
	EngineTelemetry  string
	EngineLogs       string
	Retention        string
	// LMCache is "off" when the host runs no LMCache ("auto" or empty
	// otherwise).
	LMCache      string
	MaxBodyBytes int64
	// MaxBodyBytesInFlight bounds the request bodies held in memory, all
	// together (0: the router's default).
	MaxBodyBytesInFlight int64
	// Listener bounds each listener's connections and the time a client
	// may take (zero values: the defaults of api.ListenerOptions and
	// config's).
	Listener ListenerSettings
	// TLS serves the inference endpoint over TLS (empty: plain HTTP).
	TLS             api.TLSFiles
	RequestDeadline time.Duration
	DrainTimeout    time.Duration
	// MaxWaitingTotal and MaxWaitingBytes bound the requests waiting for a
	// place, all deployments together (0: the router's defaults).
	MaxWaitingTotal int
	MaxWaitingBytes int64
	// RequestLedger keeps the request records (zero: the store's defaults;
	// MaxRecords < 0 turns the ledger off).
	RequestLedger store.RequestWriterOptions
	// Responses keeps the Responses API's stored responses (zero: the
	// defaults; a negative Retention keeps none).
	Responses responses.Options
	// Usage keeps the API keys' usage (zero: the defaults).
	Usage usage.Options
	// ReadyIdle and ParkedIdle are the role's default idle timers for
	// deployments that set none (lifecycle_defaults.*; 0 = off).
	ReadyIdle  time.Duration
	ParkedIdle time.Duration
	// Switching is how models that compete for one card take turns
	// (switching.*; zero values take the lifecycle's defaults).
	Switching lifecycle.SwitchingConfig
	// ProgressInterval spaces a waiting stream's progress comments
	// (limits.progress_interval; 0: the router's default).
	ProgressInterval time.Duration
	// HostEnv is added to every engine's environment.
	HostEnv map[string]string
	// GPU selects the GPU inventory (gpu.provider and the simulated
	// GPU's shape); an empty provider is auto.
	GPU GPUSettings
	// Memory holds the memory domains' limits (memory.system.*,
	// memory.gpu.*); zero values are auto.
	Memory config.MemoryConfig
	// DriverDeadlines bound driver calls by kind and set the pings
	// (drivers.*; zero fields take pluginmgr's defaults).
	DriverDeadlines pluginmgr.Deadlines
	// Executable is the capyctl binary drivers are re-executed from.
	Executable string
	// ClusterListen and ClusterAdvertise are the server role's cluster
	// listener and the address hosts dial (several machines).
	ClusterListen    string
	ClusterAdvertise string
	// ServerAddress and JoinToken are the host role's server and the
	// one-time token it joins with when it holds no certificate yet.
	ServerAddress string
	JoinToken     string
	// BootstrapExpect and ServerJoin are the server role's cluster of
	// servers (bootstrap_expect, server_join); JoinToken is then the
	// server join token.
	BootstrapExpect int
	ServerJoin      string
	// HostHeartbeat is the server's heartbeat interval for its hosts (0:
	// fleet's default).
	HostHeartbeat time.Duration
	// PeerAddress, RendezvousPorts and RequireRDMA are a host's group
	// settings; GroupStallTimeout the server's bound on a group bring-up.
	PeerAddress       string
	RendezvousPorts   string
	RequireRDMA       bool
	GroupStallTimeout time.Duration
	// RescheduleAfter is how long the leader waits for a lost host before
	// it moves the host's instances (0: never).
	RescheduleAfter time.Duration
	// RefuseAdoption: the server adopts no deployment a host made itself
	// (adopt_host_deployments = false).
	RefuseAdoption bool
	// Config is the effective configuration with each value's source,
	// published on the management API's GET /config (nil: not published).
	Config *wire.RoleConfig
}

// ListenerSettings are the listener.* settings; zero values take the
// defaults, and a negative cap is no cap.
type ListenerSettings struct {
	ReadHeaderTimeout            time.Duration
	IdleTimeout                  time.Duration
	BodyReadTimeout              time.Duration
	MaxConnections               int
	MaxUnauthenticatedPerAddress int
	// AuthFailuresPerMinute bounds an address's failed inference
	// authentications (0: the default; negative: no bound).
	AuthFailuresPerMinute int
}

// options returns a listener's options, with the defaults for zero values.
func (l ListenerSettings) options(name string, logger hclog.Logger) api.ListenerOptions {
	o := api.ListenerOptions{
		Name: name, ReadHeaderTimeout: l.ReadHeaderTimeout, IdleTimeout: l.IdleTimeout, BodyReadTimeout: l.BodyReadTimeout,
		MaxConnections: l.MaxConnections, MaxUnauthenticatedPerAddress: l.MaxUnauthenticatedPerAddress, Logger: logger,
	}
	if o.MaxConnections == 0 {
		o.MaxConnections = api.DefaultMaxConnections
	}
	if o.MaxUnauthenticatedPerAddress == 0 {
		o.MaxUnauthenticatedPerAddress = api.DefaultMaxUnauthenticatedPerAddress
	}
	// Any local user can open connections to the management listener's
	// loopback port: a flood of idle ones gives its slots to the
	// dashboard's requests (the CLI uses the Unix socket).
	o.EvictIdle = name == "management"
	return o.WithDefaults()
}

// GPUSettings are the gpu.* settings.
type GPUSettings struct {
	// Provider is auto, nvml, simulated or none.
	Provider string
	// SimState is the simulated GPU's state file; empty puts it in the
	// state directory (simgpu.json).
	SimState        string
	SimDevices      int
	SimDeviceMemory int64
	SimUnified      bool
}

// SimStateEnv carries the simulated GPU's state file to every engine (the
// testkit's fake engine reads it).
const SimStateEnv = "CAPYCTL_SIMGPU_STATE"

// Agent is a running role.
type Agent struct {
	s      Settings
	logger hclog.Logger

	Store     *store.Store
	Plugins   *pluginmgr.Manager
	GPU       gpu.Provider
	Placer    *placement.Placer
	Lifecycle *lifecycle.Manager
	Engines   *engines.Registry
	Router    *router.Router
	Requests  *store.RequestWriter
	// Responses are the Responses API's stored responses.
	Responses *responses.Store
	// Keys are the inference API's named keys; Usage counts what each
	// used (nil on a host: its server counts what it relays).
	Keys  *apikeys.Keeper
	Usage *usage.Meter
	Creds *runinfo.Credentials
	// Fleet is the server role's side of the fleet (nil otherwise);
	// FleetHost the host role's.
	Fleet     *fleet.Server
	FleetHost *hostagent.Host

	// relay is the host role's relay handler (its own inference and
	// management APIs, credentials supplied); fatal carries a host's
	// refusal by its server.
	relay http.Handler
	fatal chan error

	inferenceLn  net.Listener // the TCP listener (its address)
	managementLn net.Listener
	inferenceLim *api.LimitListener
	mgmtLim      *api.LimitListener
	mgmtSock     *api.LimitListener // the management API's Unix socket; nil: none
	inferenceTLS net.Listener       // inferenceLim in TLS, when tls is set
	inferenceSrv *http.Server
	mgmtSrv      *http.Server

	// inventory is what the GPU provider found at start.
	inventory gpu.Inventory

	startedAt time.Time
	cancel    context.CancelFunc
	wg        sync.WaitGroup

	// placed are the deployments the cluster placed on this host, with
	// the revision each runs (desired.go).
	placedMu sync.Mutex
	placed   map[string]placedRecord
}

// New prepares a role: it opens the state, credentials and store, and binds
// the listeners. Nothing is started until Run.
func New(s Settings, logger hclog.Logger) (*Agent, error) {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	if s.Role == "" {
		s.Role = "standalone"
	}
	if s.Executable == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("find own executable: %w", err)
		}
		s.Executable = exe
	}
	if s.Hostname == "" {
		s.Hostname, _ = os.Hostname()
	}
	if s.PluginDir == "" {
		s.PluginDir = filepath.Join(s.StateDir, "plugins")
	}
	if s.EnginePorts == "" {
		s.EnginePorts = "8100-8199"
	}
	// IMPORTANT: the role holds the API key, the admin token and every
	// engine's key: no core file, and no dumping through ptrace or /proc
	// by other users. Its drivers inherit the zero core-file limit and
	// disable dumpability themselves (sdk/plugin.Serve).
	if err := proc.DisableCoreDumps(); err != nil {
		logger.Warn("could not disable core dumps", "error", err)
	}
	a := &Agent{s: s, logger: logger, startedAt: time.Now().UTC(), fatal: make(chan error, 1)}
	if err := a.prepareStateDir(); err != nil {
		return nil, err
	}
	creds, err := a.credentials()
	if err != nil {
		return nil, err
	}
	a.Creds = creds
	st, err := store.Open(filepath.Join(s.StateDir, "capyctl.db"), store.Options{})
	if err != nil {
		return nil, err
	}
	a.Store = st
	if err := a.checkHostname(); err != nil {
		st.Close()
		return nil, err
	}
	if s.Role == config.RoleServer {
		return a, a.openServer()
	}
	ports, err := config.ParsePortRange(s.EnginePorts)
	if err != nil {
		st.Close()
		return nil, structs.Wrap(structs.CodeInvalidConfig, err, "engine_ports")
	}

	var lc *lifecycle.Manager
	a.Plugins = pluginmgr.New(pluginmgr.Config{
		Executable: s.Executable,
		Builtins:   Builtins,
		PluginDir:  s.PluginDir,
		LogDir:     filepath.Join(s.StateDir, "logs", "drivers"),
		SocketDir:  filepath.Join(s.StateDir, "run", "plugins"),
		Store:      st,
		Logger:     logger,
		Deadlines:  s.DriverDeadlines,
		OnRelaunch: func(family string) {
			if lc != nil {
				lc.RecoverFamily(family)
			}
		},
	})
	if err := a.openMemory(); err != nil {
		st.Close()
		return nil, err
	}
	hostEnv := map[string]string{}
	for k, v := range s.HostEnv {
		hostEnv[k] = v
	}
	if sim, ok := a.GPU.(*gpu.Simulated); ok {
		hostEnv[SimStateEnv] = sim.Path()
	}
	if len(hostEnv) == 0 {
		hostEnv = nil
	}
	policy := &sdk.HostPolicy{
		EngineTelemetry: orDefault(s.EngineTelemetry, "off"),
		EngineLogs:      orDefault(s.EngineLogs, "file"),
		Retention:       orDefault(s.Retention, "standard"),
		HostEnv:         hostEnv,
		LMCache:         offOrEmpty(s.LMCache),
		Unified:         a.Placer != nil && a.Placer.Unified(),
	}
	if policy.Retention == "zero" {
		policy.EngineLogs = "memory"
	}
	// One admission controller owns the request counts: the router admits
	// and settles through it, the lifecycle reads it before it drains,
	// parks, switches or idles, and restarts an instance whose places cut
	// requests fill.
	adm := admission.New(admission.Config{
		MaxWaitingTotal: s.MaxWaitingTotal,
		MaxWaitingBytes: s.MaxWaitingBytes,
		OnSaturated: func(dep, instance string) {
			logger.Named("router").Warn("cancelled requests waiting for the next stop hold every place: restarting the instance",
				"deployment", dep, "instance", instance)
			lc.RestartForSettlement(instance)
		},
	})
	lc = lifecycle.New(lifecycle.Config{
		Requests: adm,
		Store:    st,
		Drivers:  a.Plugins,
		Ports:    lifecycle.NewPortPool(ports.First, ports.Last),
		Host:     lifecycle.Host{Name: s.Hostname, StateDir: s.StateDir, ModelsRoot: s.ModelsRoot, Policy: policy},
		Placer:   a.Placer,
		Logger:   logger,
		// The role's defaults for deployments that set no idle timers.
		ReadyIdleTimeout:  s.ReadyIdle,
		ParkedIdleTimeout: s.ParkedIdle,
		Group:             a.groupSettings(),
		Switching:         s.Switching,
		RequestDeadline:   s.RequestDeadline,
	})
	a.Lifecycle = lc
	a.Engines = engines.New(st, a.Plugins, lc)
	a.Requests = store.NewRequestWriter(st, ledgerOptions(s.RequestLedger, logger))
	a.Responses = a.openResponses()
	if err := a.openKeys(); err != nil {
		_ = a.Responses.Close()
		_ = a.Requests.Close()
		a.closeMemory()
		st.Close()
		return nil, err
	}
	a.Router = router.New(router.Config{Lifecycle: lc, Admission: adm, Logger: logger, MaxBodyBytes: s.MaxBodyBytes, DefaultDeadline: s.RequestDeadline,
		RequestLog: a.Requests, MaxWaitingTotal: s.MaxWaitingTotal, MaxWaitingBytes: s.MaxWaitingBytes,
		MaxBodyBytesInFlight: s.MaxBodyBytesInFlight, BodyReadTimeout: s.Listener.options("inference", logger).BodyReadTimeout,
		Responses: a.Responses, ProgressEvery: s.ProgressInterval, Collectors: []prometheus.Collector{api.HeldCollector(lc)}})
	if err := a.Router.Register(lifecycle.SwitchCollector{M: lc}); err != nil {
		logger.Warn("could not export the switching metrics", "error", err)
	}

	if err := a.listen(); err != nil {
		a.closeKeys()
		_ = a.Responses.Close()
		_ = a.Requests.Close()
		a.closeMemory()
		st.Close()
		return nil, err
	}
	return a, nil
}

// openKeys opens the usage counts (not on a host: its server counts what
// it relays) and the named keys kept in the role's store, the role's own
// key among them as the key named default.
func (a *Agent) openKeys() error {
	if err := a.openUsage(); err != nil {
		return err
	}
	backend, err := apikeys.NewStoreBackend(a.Store, time.Now())
	if err != nil {
		a.closeKeys()
		return err
	}
	return a.openKeeper(backend)
}

// openUsage opens the keys' usage counts (not on a host: its server
// counts what it relays).
func (a *Agent) openUsage() error {
	if a.s.Role == config.RoleHost {
		return nil
	}
	o := a.s.Usage
	o.Logger = a.logger
	m, err := usage.Open(a.Store, o)
	if err != nil {
		return err
	}
	a.Usage = m
	return nil
}

// openKeeper starts the keeper of the keys in backend.
func (a *Agent) openKeeper(backend apikeys.Backend) error {
	cfg := apikeys.Config{Backend: backend, Journal: a.Store, Logger: a.logger,
		RoleKey: func() string { return a.Creds.APIKey }}
	if a.Usage != nil {
		cfg.Usage = a.Usage
	}
	k, err := apikeys.New(cfg)
	if err != nil {
		a.closeKeys()
		return err
	}
	a.Keys = k
	k.Start()
	return nil
}

// closeKeys stops the keeper and the usage counts, writing what they hold
// (before the store closes).
func (a *Agent) closeKeys() {
	if a.Keys != nil {
		a.Keys.Close()
	}
	if a.Usage != nil {
		a.Usage.Close()
	}
}

// ledgerOptions completes the request ledger's options.
// openResponses starts the Responses API's stored responses on the role's
// store; the node named in their IDs is the role's host name.
func (a *Agent) openResponses() *responses.Store {
	o := a.s.Responses
	o.Logger, o.Node = a.logger, a.s.Hostname
	return responses.Open(a.Store, o)
}

func ledgerOptions(o store.RequestWriterOptions, logger hclog.Logger) store.RequestWriterOptions {
	def := store.DefaultRequestWriterOptions()
	if o.MaxRecords == 0 {
		o.MaxRecords = def.MaxRecords
	}
	if o.MaxAge == 0 {
		o.MaxAge = def.MaxAge
	}
	o.Logger = logger.Named("request_ledger")
	return o
}

// openMemory opens the GPU inventory the settings name and the placer
// (the memory ledger) over it, and charges the instances the store says
// may still run. Limits that do not fit this machine are invalid_config.
func (a *Agent) openMemory() error {
	g := a.s.GPU
	opts := gpu.Options{
		Provider: orDefault(g.Provider, gpu.KindAuto), SimState: g.SimState,
		SimDevices: g.SimDevices, SimDeviceMemory: g.SimDeviceMemory, SimUnified: g.SimUnified,
	}
	if opts.Provider == gpu.KindSimulated {
		if opts.SimState == "" {
			opts.SimState = filepath.Join(a.s.StateDir, "simgpu.json")
		}
		if opts.SimDevices == 0 {
			opts.SimDevices = 1
		}
		if opts.SimDeviceMemory == 0 {
			opts.SimDeviceMemory = 24 * structs.GiB
		}
	}
	prov, err := gpu.Open(opts)
	if err != nil {
		return structs.Wrap(structs.CodeInvalidConfig, err, "gpu.provider %s", opts.Provider)
	}
	a.inventory = gpu.Describe(prov)
	a.logInventory(opts.Provider)
	placer, err := placement.New(placement.Config{
		Host: a.s.Hostname, GPU: prov, Memory: a.s.Memory, Store: a.Store, Logger: a.logger,
	})
	if err != nil {
		prov.Close()
		return err
	}
	insts, err := a.Store.AllInstances()
	if err != nil {
		placer.Close()
		prov.Close()
		return structs.Wrap(structs.CodeInternal, err, "load instances")
	}
	placer.Restore(insts)
	a.GPU, a.Placer = prov, placer
	return nil
}

func (a *Agent) closeMemory() {
	if a.Placer != nil {
		a.Placer.Close()
	}
	if a.GPU != nil {
		_ = a.GPU.Close()
	}
}

func orDefault(v, d string) string {
	if v == "" {
		return d
	}
	return v
}

// prepareStateDir creates the state directory owner-only.
func (a *Agent) prepareStateDir() error {
	if a.s.StateDir == "" {
		return structs.Errf(structs.CodeInvalidConfig, "no state directory")
	}
	for _, d := range []string{a.s.StateDir, filepath.Join(a.s.StateDir, "run"), filepath.Join(a.s.StateDir, "logs")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return structs.Wrap(structs.CodeInvalidConfig, err, "create state directory")
		}
		if err := os.Chmod(d, 0o700); err != nil {
			return structs.Wrap(structs.CodeInvalidConfig, err, "make state directory owner-only")
		}
	}
	return nil
}

// credentials reads the role's credentials, generating them on the first
// start. They are never printed to a log or put on a command line.
func (a *Agent) credentials() (*runinfo.Credentials, error) {
	c, err := runinfo.ReadCredentials(a.s.StateDir)
	if err == nil {
		return c, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		// IMPORTANT: no fallback key. An unreadable credentials file stops
		// the role.
		return nil, structs.Wrap(structs.CodeUnauthorized, err, "read credentials")
	}
	c = &runinfo.Credentials{APIKey: "capy-" + secret(32), AdminToken: "capyadm-" + secret(32)}
	if err := runinfo.WriteCredentials(a.s.StateDir, c); err != nil {
		return nil, structs.Wrap(structs.CodeInternal, err, "write credentials")
	}
	return c, nil
}

func secret(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// checkHostname refuses state written under another hostname (a new
// container without --hostname).
func (a *Agent) checkHostname() error { return a.Store.PinHostname(a.s.Hostname) }

// listen binds the inference and management listeners.
func (a *Agent) listen() error {
	mhost, _, err := net.SplitHostPort(a.s.ManagementListen)
	if err != nil {
		return structs.Wrap(structs.CodeInvalidConfig, err, "management_listen %q", a.s.ManagementListen)
	}
	if ip := net.ParseIP(mhost); mhost != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return structs.Errf(structs.CodeInvalidConfig, "management_listen %q must be a loopback address", a.s.ManagementListen)
	}
	ln, err := listenTCP(a.s.Listen, "listen", "--listen")
	if err != nil {
		return err
	}
	mln, err := listenTCP(a.s.ManagementListen, "management_listen", "--management-listen")
	if err != nil {
		ln.Close()
		return err
	}
	a.inferenceLn, a.managementLn = ln, mln
	a.inferenceLim = api.NewLimitListener(ln, a.s.Listener.options("inference", a.logger))
	a.mgmtLim = api.NewLimitListener(mln, a.s.Listener.options("management", a.logger))
	a.listenManagementSocket()
	if a.s.TLS.Enabled() {
		tln, err := api.TLSListener(a.inferenceLim, a.s.TLS, a.logger)
		if err != nil {
			ln.Close()
			mln.Close()
			return structs.Wrap(structs.CodeInvalidConfig, err, "tls")
		}
		a.inferenceTLS = tln
	}
	for _, w := range a.Warnings() {
		a.logger.Warn(w)
	}
	return nil
}

// listenManagementSocket binds the management API's Unix socket in the
// owner-only run directory (runinfo.ManagementSocketFile): the CLI's way
// in, which no other local user can open, so no local connection flood
// locks the operator out (the loopback port stays for the dashboard and
// controllers). A stale socket of an earlier role is removed: the store,
// open already, proves no other role runs on this state directory. A
// path too long for a socket (108 bytes) leaves the CLI on the port.
func (a *Agent) listenManagementSocket() {
	path := filepath.Join(a.s.StateDir, runinfo.ManagementSocketFile)
	if len(path) >= 104 {
		a.logger.Warn("no management socket: the state directory's path is too long for one; the CLI uses the loopback port", "path", path)
		return
	}
	_ = os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		a.logger.Warn("no management socket; the CLI uses the loopback port", "path", path, "error", err)
		return
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		a.logger.Warn("no management socket; the CLI uses the loopback port", "path", path, "error", err)
		return
	}
	o := a.s.Listener.options("management", a.logger)
	o.Name, o.MaxUnauthenticatedPerAddress, o.EvictIdle = "management-socket", 0, false
	a.mgmtSock = api.NewLimitListener(ln, o)
}

// Warnings are what an operator should fix in the running role; the log
// has them at start and `capyctl status` shows them.
func (a *Agent) Warnings() []string {
	var out []string
	if w := api.PlainListenerWarning(a.s.Listen, a.s.TLS.Enabled()); w != "" {
		out = append(out, w)
	}
	if a.Fleet != nil {
		out = append(out, a.Fleet.ClusterWarnings()...)
	}
	return out
}

// InferenceScheme is https with TLS, else http.
func (a *Agent) InferenceScheme() string {
	if a.s.TLS.Enabled() {
		return "https"
	}
	return "http"
}

// InferenceAddr returns the bound inference address.
func (a *Agent) InferenceAddr() string { return a.inferenceLn.Addr().String() }

// ManagementAddr returns the bound management address.
func (a *Agent) ManagementAddr() string { return a.managementLn.Addr().String() }

// Settings returns the effective settings.
func (a *Agent) Settings() Settings { return a.s }

// Start recovers the recorded instances and starts serving.
func (a *Agent) Start(ctx context.Context) error {
	if a.Fleet != nil {
		return a.startServer()
	}
	rctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		a.Plugins.Watch(rctx, 250*time.Millisecond)
	}()
	// Every driver a previous core left running is re-attached (or ended)
	// before recovery, not only those of running instances: the others
	// would outlive the next clean stop.
	a.Plugins.AdoptRecorded(ctx)
	if err := a.Lifecycle.Start(ctx); err != nil {
		return err
	}
	requestExtras, memoryExtras := api.RequestExtras(a.Router), api.MemoryExtras(a.Placer)
	backend := &api.Backend{
		Lifecycle: a.Lifecycle, Store: a.Store, Engines: a.Engines, Router: a.Router, Logger: a.logger, Responses: a.Responses,
		Keys: a.Keys, Usage: a.Usage,
		Role: wire.RoleInfo{
			Role: a.s.Role, Version: version.Version, Commit: version.GetCommit(), Host: a.s.Hostname,
			Inference: a.InferenceAddr(), StartedAt: a.startedAt, PID: os.Getpid(),
			TLS: a.s.TLS.Enabled(), ClientCertificates: a.s.TLS.ClientCAFile != "", Warnings: a.Warnings(),
			GPU: a.gpuInventory(), ModelsRoot: a.s.ModelsRoot,
		},
		Hosts:         a.hosts,
		RequestLedger: a.requestLedgerStatus,
		DeploymentExtras: func(st *wire.DeploymentStatus) {
			memoryExtras(st)
			requestExtras(st)
		},
	}
	if rc := a.s.Config; rc != nil {
		backend.Config = func() *wire.RoleConfig { return rc }
	}
	iopts, mopts := a.s.Listener.options("inference", a.logger), a.s.Listener.options("management", a.logger)
	inference := api.NewInferenceHandler(backend, a.Keys, api.AuthOptions{FailuresPerMinute: a.s.Listener.AuthFailuresPerMinute})
	backend.Inference, backend.InferenceKeys = inference, a.playgroundKeys
	management := api.NewManagementHandler(backend, a.Creds.AdminToken)
	a.inferenceSrv = api.NewServer(inference, iopts)
	a.mgmtSrv = api.NewServer(api.BodyDeadline(management, mopts.BodyReadTimeout), mopts)
	if a.s.Role == config.RoleHost {
		a.relay = relayHandler(inference, management, a.Creds)
	}
	a.serve()
	if a.s.Role == config.RoleHost {
		if err := a.joinServer(ctx, rctx); err != nil {
			return err
		}
	}
	return a.writeRunInfo()
}

// requestLedgerStatus describes the request ledger's writer; nil without
// one.
func (a *Agent) requestLedgerStatus() *wire.RequestLedgerStatus {
	if a.Requests == nil {
		return nil
	}
	st := &wire.RequestLedgerStatus{Enabled: a.Requests.Enabled(), Dropped: a.Requests.Dropped()}
	if err := a.Requests.Err(); err != nil {
		st.LastError = err.Error()
	}
	return st
}

func (a *Agent) hosts() []wire.Host {
	var engs []string
	if list, err := a.Engines.List(); err == nil {
		for _, e := range list {
			engs = append(engs, e.Name)
		}
	}
	h := wire.Host{Name: a.s.Hostname, Online: true, Role: a.s.Role, Engines: engs}
	h.GPUs, h.Ledger = api.HostView(a.Placer)
	return []wire.Host{h}
}

func (a *Agent) writeRunInfo() error {
	ri := runinfo.RunInfo{
		Role: a.s.Role, PID: os.Getpid(), Management: a.ManagementAddr(), Inference: a.InferenceAddr(),
		StartedAt: a.startedAt, Version: version.Version, Host: a.s.Hostname,
	}
	if a.mgmtSock != nil {
		ri.ManagementSocket = a.mgmtSock.Addr().String()
	}
	if err := runinfo.WriteRunInfo(a.s.StateDir, ri); err != nil {
		return structs.Wrap(structs.CodeInternal, err, "write run info")
	}
	return nil
}

// Shutdown stops serving: admission closes, admitted requests get up to
// the drain timeout, and the role exits without touching engines (unless
// stopEngines, dev mode's Ctrl-C).
func (a *Agent) Shutdown(ctx context.Context, stopEngines bool) {
	runinfo.RemoveRunInfo(a.s.StateDir)
	drain := a.s.DrainTimeout
	if drain <= 0 {
		drain = 30 * time.Second
	}
	dctx, cancel := context.WithTimeout(ctx, drain)
	if a.inferenceSrv != nil {
		_ = a.inferenceSrv.Shutdown(dctx)
	} else {
		a.inferenceLn.Close()
	}
	// Streams the router took over from net/http are not Shutdown's: they
	// get what is left of the drain timeout, then are cut cleanly.
	if a.Router != nil {
		a.Router.Drain(dctx)
	}
	if a.Fleet != nil {
		a.Fleet.DrainStreams(dctx) // the streams the server relays, taken over from net/http
	}
	cancel()
	if a.Fleet != nil {
		a.Fleet.Close()
	}
	if stopEngines && a.Lifecycle != nil {
		sctx, scancel := context.WithTimeout(ctx, time.Minute)
		a.Lifecycle.StopAllEngines(sctx)
		scancel()
	}
	if a.mgmtSrv != nil {
		mctx, mcancel := context.WithTimeout(ctx, 2*time.Second)
		_ = a.mgmtSrv.Shutdown(mctx)
		mcancel()
	} else {
		a.managementLn.Close()
		if a.mgmtSock != nil {
			a.mgmtSock.Close()
		}
	}
	if a.cancel != nil {
		a.cancel()
	}
	if a.Lifecycle != nil {
		a.Lifecycle.Close()
		a.Plugins.Shutdown(false)
		a.Router.Close()
	}
	a.wg.Wait()
	if a.Requests != nil {
		_ = a.Requests.Close()
	}
	if a.Responses != nil {
		_ = a.Responses.Close()
	}
	a.closeKeys()
	a.closeMemory()
	a.Store.Close()
}

// Banner describes the running role for people.
func (a *Agent) Banner(w io.Writer) {
	fmt.Fprintf(w, "CapyCTL %s (%s) %s role on %s\n", version.Version, version.GetCommit(), a.s.Role, a.s.Hostname)
	fmt.Fprintf(w, "  Inference:   %s://%s (Authorization: Bearer <api key>)\n", a.InferenceScheme(), a.InferenceAddr())
	for _, warn := range a.Warnings() {
		fmt.Fprintf(w, "  Warning:     %s\n", warn)
	}
	fmt.Fprintf(w, "  Management:  http://%s (admin token, loopback only)\n", a.ManagementAddr())
	if a.mgmtSock != nil {
		fmt.Fprintf(w, "               and %s (the CLI's way in: this user only)\n", a.mgmtSock.Addr().String())
	}
	fmt.Fprintf(w, "  Dashboard:   http://%s%s (log in with the admin token)\n", a.ManagementAddr(), dashboard.Prefix)
	if inv := a.gpuInventory(); inv != nil {
		for i, line := range inv.Lines() {
			label := "GPUs:"
			if i > 0 {
				label = ""
			}
			fmt.Fprintf(w, "  %-12s %s\n", label, line)
		}
		fmt.Fprintf(w, "  Models:      %s\n", a.s.ModelsRoot)
	}
	fmt.Fprintf(w, "  State:       %s\n", a.s.StateDir)
	fmt.Fprintf(w, "  Credentials: %s\n", filepath.Join(a.s.StateDir, runinfo.CredentialsFile))
	if a.Fleet != nil {
		fmt.Fprintf(w, "  Cluster:     %s (hosts dial %s; mutual TLS; CA sha256 %s)\n", a.Fleet.Addr(), a.Fleet.Advertise(), a.Fleet.CAFingerprint())
		fmt.Fprintf(w, "  Join a host: capyctl create join-token, then on the host: capyctl start host --server %s --join-token-file FILE\n", a.Fleet.Advertise())
		return
	}
	if a.FleetHost != nil {
		fmt.Fprintf(w, "  Server:      %s (joined; certificate expires %s)\n", a.s.ServerAddress, a.FleetHost.CertExpiry().UTC().Format(time.RFC3339))
	}
	if list, err := a.Engines.List(); err == nil {
		if len(list) == 0 {
			fmt.Fprintln(w, "  Engines:     none registered; add one with capyctl engine add <venv|llama-server>")
			fmt.Fprintln(w, "               or capyctl engine add --custom <program> --name <name> --manifest <file>")
		} else {
			names := make([]string, 0, len(list))
			for _, e := range list {
				names = append(names, fmt.Sprintf("%s (%s %s)", e.Name, e.Family, e.Version))
			}
			fmt.Fprintf(w, "  Engines:     %s\n", strings.Join(names, ", "))
		}
	}
}

// offOrEmpty is a host's lmcache as the driver protocol says it: "off",
// or empty when each deployment decides.
func offOrEmpty(v string) string {
	if v == "off" {
		return v
	}
	return ""
}
