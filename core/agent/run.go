// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/capyctl/capyctl/core/api"
	"github.com/capyctl/capyctl/core/config"
	"github.com/capyctl/capyctl/core/lifecycle"
	"github.com/capyctl/capyctl/core/pluginmgr"
	"github.com/capyctl/capyctl/core/responses"
	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/usage"
)

// Options are what a command hands the agent to run a role: the CLI's one
// entry point into the core (`start standalone`, `dev`, and the roles to
// come call Run and nothing else of the core).
type Options struct {
	// Settings are the role's settings (SettingsFromConfig makes them from
	// a loaded configuration).
	Settings Settings
	Logger   hclog.Logger
	// Ready runs once the role serves, before Run waits for ctx: a command
	// prints its banner and, for dev, sets the role up through its
	// management API. An error stops the role and Run returns it.
	Ready func(ctx context.Context, r Running) error
	// Stopping runs when ctx ends and returns the context the shutdown
	// runs under (its deadline bounds the drain; a second signal may cut
	// it short). Nil: the drain timeout and 30 seconds.
	Stopping func() (context.Context, context.CancelFunc)
	// StopEngines stops the engines at shutdown (dev's Ctrl-C); a role
	// leaves them running for the next start to re-attach.
	StopEngines bool
}

// Shutdown bounds when Options.Stopping is nil: the drain timeout (or
// defaultDrain) and the slack the rest of the shutdown takes.
const (
	defaultDrain  = 30 * time.Second
	shutdownSlack = 30 * time.Second
)

// Running is what a command sees of a role that serves: its addresses, its
// credentials and its banner. Everything else goes through the management
// API.
type Running struct{ a *Agent }

// InferenceAddr is the inference listener's address.
func (r Running) InferenceAddr() string { return r.a.InferenceAddr() }

// ManagementAddr is the management listener's address.
func (r Running) ManagementAddr() string { return r.a.ManagementAddr() }

// APIKey is the inference API key.
func (r Running) APIKey() string { return r.a.Creds.APIKey }

// AdminToken is the management API's admin token.
func (r Running) AdminToken() string { return r.a.Creds.AdminToken }

// GPUKind names the GPU provider ("nvml", "simulated", "none").
func (r Running) GPUKind() string {
	if r.a.GPU == nil {
		return "none"
	}
	return r.a.GPU.Kind()
}

// Settings are the role's effective settings.
func (r Running) Settings() Settings { return r.a.Settings() }

// Banner describes the running role for people.
func (r Running) Banner(w io.Writer) { r.a.Banner(w) }

// EngineNames lists the registered engines' names.
func (r Running) EngineNames() ([]string, error) {
	if r.a.Engines == nil {
		return nil, nil
	}
	list, err := r.a.Engines.List()
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(list))
	for _, e := range list {
		names = append(names, e.Name)
	}
	return names, nil
}

// Run runs a role until ctx ends: it builds the agent, starts it, calls
// opts.Ready, waits, and shuts down (engines keep running unless
// opts.StopEngines). A failed start leaves nothing running.
func Run(ctx context.Context, opts Options) error {
	logger := opts.Logger
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	routeGRPCLogs(logger)
	a, err := New(opts.Settings, logger)
	if err != nil {
		return err
	}
	if err := a.Start(ctx); err != nil {
		a.Shutdown(context.Background(), opts.StopEngines)
		return err
	}
	if opts.Ready != nil {
		if err := opts.Ready(ctx, Running{a}); err != nil {
			a.Shutdown(context.Background(), opts.StopEngines)
			return err
		}
	}
	var fatal error
	select {
	case <-ctx.Done():
	case fatal = <-a.Fatal():
	}
	stopping := opts.Stopping
	if stopping == nil {
		stopping = func() (context.Context, context.CancelFunc) {
			drain := a.s.DrainTimeout
			if drain <= 0 {
				drain = defaultDrain
			}
			return context.WithTimeout(context.Background(), drain+shutdownSlack)
		}
	}
	sctx, cancel := stopping()
	defer cancel()
	a.Shutdown(sctx, opts.StopEngines)
	return fatal
}

// SettingsFromConfig turns a role configuration into the agent's settings.
func SettingsFromConfig(cfg *config.Config) Settings {
	return Settings{
		Role:                 cfg.Role,
		StateDir:             cfg.StateDir,
		Listen:               cfg.Listen,
		ManagementListen:     cfg.ManagementListen,
		ClusterListen:        cfg.ClusterListen,
		ClusterAdvertise:     cfg.ClusterAdvertise,
		ServerAddress:        cfg.ServerAddress,
		BootstrapExpect:      cfg.BootstrapExpect,
		ServerJoin:           cfg.ServerJoin,
		HostHeartbeat:        cfg.HostHeartbeat.D(),
		PeerAddress:          cfg.PeerAddress,
		RendezvousPorts:      cfg.RendezvousPorts.String(),
		RequireRDMA:          cfg.RequireRDMA,
		GroupStallTimeout:    cfg.GroupStallTimeout.D(),
		RescheduleAfter:      cfg.RescheduleAfter.D(),
		RefuseAdoption:       !cfg.AdoptHostDeployments,
		PluginDir:            cfg.PluginDir,
		ModelsRoot:           cfg.ModelsRoot,
		EnginePorts:          fmt.Sprintf("%d-%d", cfg.EnginePorts.First, cfg.EnginePorts.Last),
		Hostname:             cfg.Hostname,
		EngineTelemetry:      cfg.EngineTelemetry,
		EngineLogs:           cfg.EngineLogs,
		Retention:            cfg.Retention,
		LMCache:              cfg.LMCache,
		MaxBodyBytes:         int64(cfg.Limits.MaxBodyBytes),
		MaxBodyBytesInFlight: int64(cfg.Limits.MaxBodyBytesInFlight),
		Listener: ListenerSettings{
			ReadHeaderTimeout: cfg.Listener.ReadHeaderTimeout.D(), IdleTimeout: cfg.Listener.IdleTimeout.D(),
			BodyReadTimeout: cfg.Listener.BodyReadTimeout.D(), MaxConnections: noCap(cfg.Listener.MaxConnections),
			MaxUnauthenticatedPerAddress: noCap(cfg.Listener.MaxUnauthenticatedPerAddress),
			AuthFailuresPerMinute:        noCap(cfg.Listener.AuthFailuresPerMinute),
		},
		TLS:             api.TLSFiles{CertFile: cfg.TLS.CertFile, KeyFile: cfg.TLS.KeyFile, ClientCAFile: cfg.TLS.ClientCAFile},
		RequestDeadline: cfg.Limits.RequestDeadline.D(),
		DrainTimeout:    cfg.Shutdown.DrainTimeout.D(),
		GPU: GPUSettings{
			Provider: cfg.GPU.Provider, SimState: cfg.GPU.SimState, SimDevices: cfg.GPU.SimDevices,
			SimDeviceMemory: int64(cfg.GPU.SimDeviceMemory), SimUnified: cfg.GPU.SimUnified,
		},
		Memory:          cfg.Memory,
		MaxWaitingTotal: cfg.Limits.MaxWaitingTotal,
		MaxWaitingBytes: int64(cfg.Limits.MaxWaitingBytes),
		RequestLedger:   requestLedger(cfg.RequestLedger),
		Responses:       responsesOptions(cfg),
		Usage:           usage.Options{Retention: cfg.Usage.Retention.D()},
		ReadyIdle:       cfg.LifecycleDefaults.ReadyIdleTimeout.D(),
		ParkedIdle:      cfg.LifecycleDefaults.ParkedIdleTimeout.D(),
		Switching: lifecycle.SwitchingConfig{
			Policy: cfg.Switching.Policy, TurnTime: cfg.Switching.TurnTime.D(), TurnRequests: cfg.Switching.TurnRequests,
		},
		ProgressInterval: cfg.Limits.ProgressInterval.D(),
		DriverDeadlines: pluginmgr.Deadlines{
			Call: cfg.Drivers.CallTimeout.D(), Plan: cfg.Drivers.PlanTimeout.D(), Start: cfg.Drivers.StartTimeout.D(),
			Park: cfg.Drivers.ParkTimeout.D(), Stop: cfg.Drivers.StopTimeout.D(),
			PingInterval: cfg.Drivers.PingInterval.D(), PingTimeout: cfg.Drivers.PingTimeout.D(),
		},
	}
}

// noCap turns a cap of 0 (none, in the configuration) into the agent's
// "no cap" (a negative value; 0 takes the default there).
func noCap(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

// responsesOptions turns responses.* into the store's options: a
// retention of 0 keeps nothing. A host (which has no such settings: its
// server keeps what it relays) keeps, with the defaults, what clients
// send to its own listener.
func responsesOptions(cfg *config.Config) responses.Options {
	if cfg.Role == config.RoleHost {
		return responses.Options{}
	}
	c := cfg.Responses
	o := responses.Options{Retention: c.Retention.D(), MaxBytes: int64(c.MaxBytes)}
	if o.Retention == 0 {
		o.Retention = -1
	}
	return o
}

// requestLedger turns request_ledger.* into the writer's options: disabled
// (or no records or no time kept) keeps nothing.
func requestLedger(rl config.RequestLedger) store.RequestWriterOptions {
	if !rl.Enabled || rl.MaxRecords == 0 || rl.Retention == 0 {
		return store.RequestWriterOptions{MaxRecords: -1}
	}
	return store.RequestWriterOptions{MaxRecords: rl.MaxRecords, MaxAge: rl.Retention.D()}
}
