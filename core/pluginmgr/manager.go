// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package pluginmgr is the driver catalog: it discovers drivers (built into
// the capyctl binary, or capyctl-driver-<name> programs in the role's plugin
// directory), launches each once through go-plugin, reads its Describe,
// supervises it (a crashed driver, or one that stops answering pings, is
// relaunched with backoff and the core is told so it can Recover its
// instances), bounds every call by a deadline, records go-plugin reattach
// configs in the store, and after a core restart re-attaches to the drivers
// still running, falling back to a fresh launch.
//
// A driver listens on a unix socket in the role's run/plugins directory
// (0700) and speaks gRPC over mutual TLS (see tls.go), so no other local
// user, and no process without the core's certificate, can call it.
package pluginmgr

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk"
	sdkplugin "github.com/capyctl/capyctl/sdk/plugin"
	"github.com/capyctl/capyctl/sdk/proc"
)

// ExternalPrefix is the file-name prefix of third-party driver programs.
const ExternalPrefix = "capyctl-driver-"

// ReattachStore is the part of the store the manager needs.
type ReattachStore interface {
	PutReattach(driver string, r store.ReattachRecord) error
	GetReattach(driver string) (*store.ReattachRecord, error)
	DeleteReattach(driver string) error
	ListReattach() ([]store.ReattachRecord, error)
}

// Config configures a Manager.
type Config struct {
	// Executable is the capyctl binary built-in drivers re-execute
	// (`<Executable> driver <family>`).
	Executable string
	// Builtins are the families compiled into Executable.
	Builtins []string
	// PluginDir holds capyctl-driver-<name> programs.
	PluginDir string
	// LogDir receives one JSON log file per driver.
	LogDir string
	// SocketDir is where drivers create their unix sockets; it is made
	// owner-only (0700). Empty leaves them in go-plugin's default (the
	// system temporary directory), which only tests should do.
	SocketDir string
	Store     ReattachStore
	Logger    hclog.Logger
	// OnRelaunch is called (in its own goroutine) after a driver was
	// relaunched because the previous process died, so the core can call
	// Recover for that driver's instances.
	OnRelaunch func(family string)
	// Env is added to every driver's environment.
	Env []string
	// MaxBackoff bounds the relaunch backoff (default 10s).
	MaxBackoff time.Duration
	// Deadlines bound each driver call by kind and set the pings.
	Deadlines Deadlines
}

// Manager owns the driver processes.
type Manager struct {
	cfg    Config
	logger hclog.Logger

	mu      sync.Mutex
	drivers map[string]*driverProc
	closed  bool
	// callbacks counts OnRelaunch calls in flight (added under mu while
	// not closed); Shutdown waits for them.
	callbacks sync.WaitGroup

	// sockDir is the directory drivers listen in, chosen at the first
	// launch (socketDir); sockFallback when it is a temporary one.
	sockMu       sync.Mutex
	sockDir      string
	sockFallback bool

	// launcher marks every driver this manager launches (envLauncher), so
	// that a later core tells them from the ones it must end (strays.go).
	launcher string
}

// driverProc is one running (or relaunching) driver.
type driverProc struct {
	family  string
	program string
	args    []string

	mu       sync.Mutex
	client   *goplugin.Client
	rpc      *sdkplugin.Client
	conn     *grpc.ClientConn
	describe *sdk.DescribeResponse
	pid      int
	// ticks is the driver process's start time, so that a kill never
	// reaches a recycled PID.
	ticks uint64
	// addr is the driver's socket.
	addr string
	// protocol is the driver protocol the launch negotiated.
	protocol int
	// pingFailures counts pings missed in a row; pinging is true while
	// one is in flight.
	pingFailures int
	pinging      bool
	lastPing     time.Time
	// generation counts launches; a relaunch bumps it.
	generation int
	launching  chan struct{}
	lastErr    error
	failures   int
}

// New returns a Manager. Nothing is launched until a driver is first used
// (or Reattach is called).
func New(cfg Config) *Manager {
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = 10 * time.Second
	}
	cfg.Deadlines = cfg.Deadlines.withDefaults()
	return &Manager{cfg: cfg, logger: cfg.Logger.Named("pluginmgr"), drivers: map[string]*driverProc{}, launcher: newLauncherID()}
}

// Families lists every driver the manager can launch: the built-ins and the
// external programs found in the plugin directory, sorted.
func (m *Manager) Families() []string {
	seen := map[string]bool{}
	for _, f := range m.cfg.Builtins {
		seen[f] = true
	}
	if m.cfg.PluginDir != "" {
		entries, _ := os.ReadDir(m.cfg.PluginDir)
		for _, e := range entries {
			name := e.Name()
			if strings.HasPrefix(name, ExternalPrefix) && !e.IsDir() {
				seen[strings.TrimPrefix(name, ExternalPrefix)] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for f := range seen {
		out = append(out, f)
	}
	sort.Strings(out)
	return out
}

// program returns how to run a family's driver.
func (m *Manager) program(family string) (string, []string, error) {
	if m.cfg.PluginDir != "" {
		p := filepath.Join(m.cfg.PluginDir, ExternalPrefix+family)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil, nil
		}
	}
	for _, b := range m.cfg.Builtins {
		if b == family {
			return m.cfg.Executable, []string{"driver", family}, nil
		}
	}
	return "", nil, structs.Errf(structs.CodeCapabilityMissing+":driver_"+structs.Code(family),
		"no driver for engine family %q (built-in: %s; external drivers are %s<name> in %s)",
		family, strings.Join(m.cfg.Builtins, ", "), ExternalPrefix, m.cfg.PluginDir)
}

// Driver returns the driver of a family, launching or re-attaching it on
// first use. The returned value stays valid across relaunches.
func (m *Manager) Driver(ctx context.Context, family string) (sdk.Driver, error) {
	d, err := m.proc(family)
	if err != nil {
		return nil, err
	}
	if _, err := d.ensure(ctx, m); err != nil {
		return nil, err
	}
	return &handle{m: m, d: d}, nil
}

// Describe returns the family's Describe answer (cached per launch).
func (m *Manager) Describe(ctx context.Context, family string) (*sdk.DescribeResponse, error) {
	d, err := m.proc(family)
	if err != nil {
		return nil, err
	}
	if _, err := d.ensure(ctx, m); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.describe, nil
}

// PID returns the process ID of a family's running driver, 0 when none.
func (m *Manager) PID(family string) int {
	m.mu.Lock()
	d := m.drivers[family]
	m.mu.Unlock()
	if d == nil {
		return 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.client == nil || d.client.Exited() {
		return 0
	}
	return d.pid
}

// Generation returns how many times a family's driver has been launched or
// re-attached in this core.
func (m *Manager) Generation(family string) int {
	m.mu.Lock()
	d := m.drivers[family]
	m.mu.Unlock()
	if d == nil {
		return 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.generation
}

func (m *Manager) proc(family string) (*driverProc, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, structs.Errf(structs.CodeShuttingDown, "the role is shutting down")
	}
	if d, ok := m.drivers[family]; ok {
		return d, nil
	}
	prog, args, err := m.program(family)
	if err != nil {
		return nil, err
	}
	d := &driverProc{family: family, program: prog, args: args}
	m.drivers[family] = d
	return d, nil
}

// ensure returns a live RPC client, launching (or re-attaching, or
// relaunching) the driver when needed. Concurrent callers share one launch.
func (d *driverProc) ensure(ctx context.Context, m *Manager) (*sdkplugin.Client, error) {
	for {
		d.mu.Lock()
		if d.client != nil && !d.client.Exited() && d.rpc != nil {
			rpc := d.rpc
			d.mu.Unlock()
			return rpc, nil
		}
		if d.launching != nil {
			ch := d.launching
			d.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, structs.Wrap(structs.CodeDriverUnavailable, ctx.Err(), "driver %s is relaunching", d.family)
			}
		}
		relaunch := d.client != nil
		ch := make(chan struct{})
		d.launching = ch
		failures := d.failures
		d.mu.Unlock()

		if relaunch && failures > 0 {
			select {
			case <-time.After(relaunchBackoff(failures, m.cfg.MaxBackoff)):
			case <-ctx.Done():
				d.mu.Lock()
				d.launching = nil
				d.mu.Unlock()
				close(ch)
				return nil, structs.Wrap(structs.CodeDriverUnavailable, ctx.Err(), "driver %s is relaunching", d.family)
			}
		}

		err := m.launch(ctx, d, !relaunch)
		d.mu.Lock()
		d.launching = nil
		if err != nil {
			d.failures++
			d.lastErr = err
		} else {
			d.failures = 0
			d.lastErr = nil
		}
		rpc := d.rpc
		d.mu.Unlock()
		close(ch)
		if err != nil {
			return nil, err
		}
		if relaunch && m.cfg.OnRelaunch != nil {
			m.mu.Lock()
			if !m.closed {
				m.callbacks.Add(1)
				go func(family string) {
					defer m.callbacks.Done()
					m.cfg.OnRelaunch(family)
				}(d.family)
			}
			m.mu.Unlock()
		}
		return rpc, nil
	}
}

// relaunchBackoff is the wait before a relaunch after failures failed
// launches in a row: 200 ms doubling each time, at most max.
func relaunchBackoff(failures int, max time.Duration) time.Duration {
	backoff := time.Duration(1<<min(failures, 8)) * 100 * time.Millisecond
	if backoff > max {
		backoff = max
	}
	return backoff
}

// launch starts the driver (trying the recorded reattach config first when
// allowed) and reads its Describe.
func (m *Manager) launch(ctx context.Context, d *driverProc, tryReattach bool) error {
	log := m.logger.With("driver", d.family)
	d.mu.Lock()
	old, oldPID, oldTicks, oldAddr := d.client, d.pid, d.ticks, d.addr
	d.mu.Unlock()
	if old != nil {
		m.endClient(d.family, old, oldPID, oldTicks)
		m.removeSocket("unix", oldAddr)
	}
	if tryReattach && m.cfg.Store != nil {
		if rec, err := m.cfg.Store.GetReattach(d.family); err == nil && rec != nil {
			if err := m.reattach(ctx, d, rec); err == nil {
				log.Info("re-attached to running driver", "pid", rec.Pid)
				return nil
			} else {
				log.Warn("re-attach failed; launching a new driver", "pid", rec.Pid, "error", err)
				m.endStray(rec)
			}
		}
	}

	tlsc, err := newClientTLS()
	if err != nil {
		return structs.Wrap(structs.CodeDriverUnavailable, err, "launch driver %s", d.family)
	}
	cmd := exec.Command(d.program, d.args...)
	cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + os.Getenv("HOME"),
		// The plugin half of go-plugin's AutoMTLS: the driver serves only
		// the holder of this certificate's key (see tls.go).
		envClientCert + "=" + string(tlsc.certPEM),
		envLauncher + "=" + m.launcher,
	}, m.cfg.Env...)
	if m.cfg.LogDir != "" {
		_ = os.MkdirAll(m.cfg.LogDir, 0o700)
		cmd.Env = append(cmd.Env, sdkplugin.EnvDriverLogFile+"="+filepath.Join(m.cfg.LogDir, d.family+".log"))
	}
	if m.cfg.SocketDir != "" {
		// IMPORTANT: go-plugin v1.8.0 honours UnixSocketConfig.TempDir
		// only with a RunnerFunc; a plain Cmd's plugin reads
		// PLUGIN_UNIX_SOCKET_DIR itself (server.go, unixSocketConfigFromEnv).
		// Without it the socket lands in /tmp with a mode that follows the
		// umask, open to every local user.
		dir, err := m.socketDir()
		if err != nil {
			return structs.Wrap(structs.CodeDriverUnavailable, err, "launch driver %s: socket directory", d.family)
		}
		cmd.Env = append(cmd.Env, goplugin.EnvUnixSocketDir+"="+dir)
	}
	// IMPORTANT: a driver has its own process group, so a terminal's Ctrl-C
	// or a systemd stop of the core's group does not take it (and so its
	// engines' supervision) down with the core.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// The driver's stderr while it launches, quoted by the error of a
	// driver that dies before its handshake (go-plugin also logs it).
	stderr := &stderrTail{}
	client := goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig:  sdkplugin.Handshake,
		VersionedPlugins: sdkplugin.VersionedPlugins(nil),
		Cmd:              cmd,
		Stderr:           stderr,
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		Logger:           log,
		SkipHostEnv:      true,
		StartTimeout:     30 * time.Second,
		TLSConfig:        tlsc.config,
		GRPCDialOptions:  m.dialOptions(),
	})
	conn, rpc, desc, err := m.dispense(ctx, client)
	if err == nil {
		if what := checkReply("Describe", client.NegotiatedVersion(), desc); what != "" {
			err = malformed(d, "Describe", nil, what)
		}
	}
	if err != nil {
		// A driver that started but does not answer is ended without
		// waiting on it (endClient).
		if rc := client.ReattachConfig(); rc != nil {
			ticks, _ := proc.ReadStartTicks(rc.Pid)
			m.endClient(d.family, client, rc.Pid, ticks)
		} else {
			client.Kill()
		}
		return launchFault(d, err, stderr.String())
	}
	pid, addr := 0, ""
	var ticks uint64
	if rc := client.ReattachConfig(); rc != nil {
		pid, addr = rc.Pid, rc.Addr.String()
		ticks, _ = proc.ReadStartTicks(rc.Pid)
		if rc.Addr.Network() == "unix" {
			// Defence in depth: the directory already keeps others out.
			_ = os.Chmod(addr, 0o600)
		}
		if m.cfg.Store != nil {
			rec := store.ReattachRecord{
				Driver:          d.family,
				Network:         rc.Addr.Network(),
				Addr:            addr,
				Pid:             rc.Pid,
				StartTicks:      ticks,
				ProtocolVersion: client.NegotiatedVersion(),
				Program:         d.program,
				UpdatedAt:       time.Now().UTC(),
				TLS:             tlsc.record(),
			}
			if err := m.cfg.Store.PutReattach(d.family, rec); err != nil {
				log.Warn("could not record the driver's reattach config", "error", err)
			}
		}
	}
	d.mu.Lock()
	d.client, d.rpc, d.conn, d.describe, d.pid, d.ticks, d.addr = client, rpc, conn, desc, pid, ticks, addr
	d.protocol = client.NegotiatedVersion()
	d.pingFailures = 0
	d.generation++
	d.mu.Unlock()
	log.Info("driver launched", "pid", pid, "version", desc.Version, "protocol", client.NegotiatedVersion())
	return nil
}

// reattach connects to a driver a previous core launched.
func (m *Manager) reattach(ctx context.Context, d *driverProc, rec *store.ReattachRecord) error {
	// IMPORTANT: never re-attach to a recycled PID (go-plugin once killed an
	// unrelated process that way); the start time must match.
	ticks, err := proc.ReadStartTicks(rec.Pid)
	if err != nil || (rec.StartTicks != 0 && ticks != rec.StartTicks) {
		return fmt.Errorf("driver process %d is gone", rec.Pid)
	}
	var addr net.Addr
	switch rec.Network {
	case "unix":
		addr = &net.UnixAddr{Name: rec.Addr, Net: "unix"}
	default:
		tcp, err := net.ResolveTCPAddr(rec.Network, rec.Addr)
		if err != nil {
			return err
		}
		addr = tcp
	}
	// IMPORTANT: a re-attached client negotiates nothing, so it is given
	// the plugin set of the recorded protocol version directly (with
	// VersionedPlugins it would know no "driver" plugin).
	set, ok := sdkplugin.VersionedPlugins(nil)[rec.ProtocolVersion]
	if !ok {
		return fmt.Errorf("driver %s speaks protocol %d, which this core does not", d.family, rec.ProtocolVersion)
	}
	// The TLS material recorded at launch; a record written by a core
	// before mutual TLS has none, and that driver speaks plain gRPC until
	// it is next relaunched.
	var tlsConfig *tls.Config
	if rec.TLS != nil {
		tlsc, err := clientTLSFrom(rec.TLS)
		if err != nil {
			return err
		}
		tlsConfig = tlsc.config
	}
	client := goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig: sdkplugin.Handshake,
		Plugins:         set,
		Reattach: &goplugin.ReattachConfig{
			Protocol:        goplugin.ProtocolGRPC,
			ProtocolVersion: rec.ProtocolVersion,
			Addr:            addr,
			Pid:             rec.Pid,
		},
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		Logger:           m.logger.With("driver", d.family),
		TLSConfig:        tlsConfig,
		GRPCDialOptions:  m.dialOptions(),
	})
	conn, rpc, desc, err := m.dispense(ctx, client)
	if err != nil {
		// The caller ends the process (endStray): it is ours, and no core
		// can reach it.
		return err
	}
	d.mu.Lock()
	d.client, d.rpc, d.conn, d.describe, d.pid, d.ticks, d.addr = client, rpc, conn, desc, rec.Pid, ticks, rec.Addr
	d.protocol = rec.ProtocolVersion
	d.pingFailures = 0
	d.generation++
	d.mu.Unlock()
	return nil
}

// dialOptions bound the connection handshake by the call deadline: go-plugin
// opens its stdio stream on connecting, without a deadline, and a stopped
// driver accepts the connection but never answers the TLS handshake; gRPC's
// own bound is 20s.
func (m *Manager) dialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
		Backoff: backoff.DefaultConfig, MinConnectTimeout: m.cfg.Deadlines.Call,
	})}
}

// dispense connects and probes a driver with Describe (a cheap RPC). On
// failure the connection is closed: a re-attach that fails is ended with a
// kill of the process, never through go-plugin, and its connection would
// otherwise go on redialling a dead socket for the life of the core.
func (m *Manager) dispense(ctx context.Context, client *goplugin.Client) (_ *grpc.ClientConn, _ *sdkplugin.Client, _ *sdk.DescribeResponse, err error) {
	cp, err := client.Client()
	if err != nil {
		return nil, nil, nil, err
	}
	gc, ok := cp.(*goplugin.GRPCClient)
	if !ok {
		return nil, nil, nil, fmt.Errorf("driver speaks %T, not gRPC", cp)
	}
	defer func() {
		if err != nil && gc.Conn != nil {
			// IMPORTANT: the raw connection, not gc.Close, which asks the
			// driver to shut down and waits on a hung one.
			_ = gc.Conn.Close()
		}
	}()
	raw, err := gc.Dispense(sdkplugin.PluginName)
	if err != nil {
		return nil, nil, nil, err
	}
	rpc, ok := raw.(*sdkplugin.Client)
	if !ok {
		return nil, nil, nil, fmt.Errorf("driver dispensed %T", raw)
	}
	pctx, cancel := context.WithTimeout(ctx, m.cfg.Deadlines.Call)
	defer cancel()
	desc, err := rpc.Describe(pctx, &sdk.DescribeRequest{})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("describe: %w", err)
	}
	return gc.Conn, rpc, desc, nil
}

// isTransport reports whether err means the driver process is unreachable
// (dead or restarting) rather than a driver answer.
func isTransport(err error) bool {
	return sdk.CodeOf(err) == sdk.CodeDriverUnavailable
}
