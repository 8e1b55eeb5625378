// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/capyctl/capyctl/core/agent"
	"github.com/capyctl/capyctl/core/api"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/config"
	"github.com/capyctl/capyctl/core/pluginmgr"
	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/core/version"
)

// StandaloneStartCommand runs the standalone role in the foreground.
type StandaloneStartCommand struct{ *Meta }

// Synopsis implements cli.Command.
func (c *StandaloneStartCommand) Synopsis() string {
	return "Run the standalone role (router, ledger, drivers and engines on this machine)"
}

// Help implements cli.Command.
func (c *StandaloneStartCommand) Help() string {
	return `Usage: capyctl start standalone [--config FILE] [options]

  Runs the standalone role in the foreground: the inference endpoint, the
  management API on loopback, the memory ledger, the driver plugins and the
  engines they start. Stopping the role (SIGTERM, Ctrl-C) never stops an
  engine: the next start re-attaches to what is running.

  Every setting comes from the config file, an environment variable
  (CAPYCTL_<SETTING>) or a flag; a flag wins over the environment, which
  wins over the file. capyctl config show prints each value and its source.

Start Options:

  --config FILE              Role configuration (HCL); env CAPYCTL_CONFIG.
  --listen ADDR              Inference address (default 0.0.0.0:8443).
  --management-listen ADDR   Management address, loopback only (default 127.0.0.1:7443).
  --models-root DIR          Where model directories live (default ~/models).
  --engine-ports RANGE       Loopback ports leased to engines (default 8100-8199).
  --plugin-dir DIR           Third-party drivers (capyctl-driver-<name>).
  --gpu-provider P           auto, nvml, simulated or none.
  --engine-logs MODE         file or memory.
  --log-level LEVEL          trace, debug, info, warn, error.
  --log-format FORMAT        auto, text or json.
  --set PATH=VALUE           Any setting by its path (repeatable).

` + GeneralOptions
}

// roleFlags maps named flags to setting paths.
var roleFlags = map[string]string{
	"listen":            "listen",
	"management-listen": "management_listen",
	"models-root":       "models_root",
	"engine-ports":      "engine_ports",
	"plugin-dir":        "plugin_dir",
	"gpu-provider":      "gpu.provider",
	"engine-logs":       "engine_logs",
	"engine-telemetry":  "engine_telemetry",
	"retention":         "retention",
	"log-level":         "log_level",
	"log-format":        "log_format",
	"hostname":          "hostname",
}

// roleOptions are the role flags of `start <role>` and `config show`.
type roleOptions struct {
	cfgFile string
	vals    map[string]*string
	sets    stringList
}

// addRoleFlags registers --config, the named role flags and --set.
func addRoleFlags(fs *flag.FlagSet) *roleOptions {
	o := &roleOptions{vals: map[string]*string{}}
	fs.StringVar(&o.cfgFile, "config", "", "")
	for flagName := range roleFlags {
		v := new(string)
		o.vals[flagName] = v
		fs.StringVar(v, flagName, "", "")
	}
	fs.Var(&o.sets, "set", "")
	return o
}

// load builds the configuration: role "" leaves the role to the file, the
// environment or the default.
func (c *Meta) loadConfig(o *roleOptions, role string) (*config.Config, string, error) {
	flags := map[string]string{}
	if role != "" {
		flags["role"] = role
	}
	for flagName, v := range o.vals {
		if *v != "" {
			flags[roleFlags[flagName]] = *v
		}
	}
	for _, s := range o.sets {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return nil, "", structs.Errf(structs.CodeInvalidRequest, "--set %q is not PATH=VALUE", s)
		}
		flags[k] = v
	}
	if c.stateDir != "" {
		flags["state_dir"] = c.stateDir
	}
	file := o.cfgFile
	if file == "" {
		file = c.Getenv("CAPYCTL_CONFIG")
	}
	if file != "" {
		if _, err := os.Stat(file); err != nil {
			return nil, file, structs.Errf(structs.CodeInvalidConfig, "configuration file %s: %v", file, errors.Unwrap(err))
		}
	}
	cfg, err := config.Load(config.LoadOptions{File: file, Env: os.Environ(), Flags: flags})
	return cfg, file, err
}

// loadRoleConfig parses the role flags and loads the configuration.
func (c *Meta) loadRoleConfig(name, role string, args []string) (*config.Config, *wire.RoleConfig, int) {
	fs := c.FlagSet(name)
	o := addRoleFlags(fs)
	if _, code := c.parse(fs, args); code != 0 {
		return nil, nil, helpOr(code)
	}
	cfg, file, err := c.loadConfig(o, role)
	if err != nil {
		return nil, nil, c.Fail(err)
	}
	return cfg, roleConfigOf(cfg, file), 0
}

// roleConfigOf is the configuration as the management API publishes it.
func roleConfigOf(cfg *config.Config, file string) *wire.RoleConfig {
	rc := &wire.RoleConfig{APIVersion: wire.APIVersion, Role: cfg.Role, File: file}
	for _, s := range cfg.Settings() {
		rc.Settings = append(rc.Settings, wire.ConfigSetting{Path: s.Path, Env: s.Env, Value: s.Value, Default: s.Default,
			From: s.From, Detail: s.Detail, Description: s.Description})
	}
	return rc
}

// settingsFromConfig turns a role configuration into the agent's settings.
func settingsFromConfig(cfg *config.Config) agent.Settings {
	return agent.Settings{
		Role:                 cfg.Role,
		StateDir:             cfg.StateDir,
		Listen:               cfg.Listen,
		ManagementListen:     cfg.ManagementListen,
		PluginDir:            cfg.PluginDir,
		ModelsRoot:           cfg.ModelsRoot,
		EnginePorts:          fmt.Sprintf("%d-%d", cfg.EnginePorts.First, cfg.EnginePorts.Last),
		Hostname:             cfg.Hostname,
		EngineTelemetry:      cfg.EngineTelemetry,
		EngineLogs:           cfg.EngineLogs,
		Retention:            cfg.Retention,
		MaxBodyBytes:         int64(cfg.Limits.MaxBodyBytes),
		MaxBodyBytesInFlight: int64(cfg.Limits.MaxBodyBytesInFlight),
		Listener: agent.ListenerSettings{
			ReadHeaderTimeout: cfg.Listener.ReadHeaderTimeout.D(), IdleTimeout: cfg.Listener.IdleTimeout.D(),
			BodyReadTimeout: cfg.Listener.BodyReadTimeout.D(), MaxConnections: noCap(cfg.Listener.MaxConnections),
			MaxUnauthenticatedPerAddress: noCap(cfg.Listener.MaxUnauthenticatedPerAddress),
		},
		TLS:             api.TLSFiles{CertFile: cfg.TLS.CertFile, KeyFile: cfg.TLS.KeyFile, ClientCAFile: cfg.TLS.ClientCAFile},
		RequestDeadline: cfg.Limits.RequestDeadline.D(),
		DrainTimeout:    cfg.Shutdown.DrainTimeout.D(),
		GPU: agent.GPUSettings{
			Provider: cfg.GPU.Provider, SimState: cfg.GPU.SimState, SimDevices: cfg.GPU.SimDevices,
			SimDeviceMemory: int64(cfg.GPU.SimDeviceMemory), SimUnified: cfg.GPU.SimUnified,
		},
		Memory:          cfg.Memory,
		MaxWaitingTotal: cfg.Limits.MaxWaitingTotal,
		MaxWaitingBytes: int64(cfg.Limits.MaxWaitingBytes),
		RequestLedger:   requestLedger(cfg.RequestLedger),
		ReadyIdle:       cfg.LifecycleDefaults.ReadyIdleTimeout.D(),
		ParkedIdle:      cfg.LifecycleDefaults.ParkedIdleTimeout.D(),
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

// requestLedger turns request_ledger.* into the writer's options: disabled
// (or no records or no time kept) keeps nothing.
func requestLedger(rl config.RequestLedger) store.RequestWriterOptions {
	if !rl.Enabled || rl.MaxRecords == 0 || rl.Retention == 0 {
		return store.RequestWriterOptions{MaxRecords: -1}
	}
	return store.RequestWriterOptions{MaxRecords: rl.MaxRecords, MaxAge: rl.Retention.D()}
}

// Run implements cli.Command.
func (c *StandaloneStartCommand) Run(args []string) int {
	cfg, rc, code := c.loadRoleConfig("start standalone", "standalone", args)
	if cfg == nil {
		return code
	}
	logger := roleLogger(cfg.LogLevel, cfg.LogFormat, c.Err)
	settings := settingsFromConfig(cfg)
	settings.Config = rc
	a, err := agent.New(settings, logger)
	if err != nil {
		return c.Fail(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := a.Start(ctx); err != nil {
		a.Shutdown(context.Background(), false)
		return c.Fail(err)
	}
	if c.JSON() {
		c.PrintJSON(banner(a))
	} else {
		a.Banner(c.Out)
	}
	logger.Info("role started", "role", "standalone", "inference", a.InferenceAddr(), "management", a.ManagementAddr())
	<-ctx.Done()
	stop()
	logger.Info("stopping the role; engines keep running")
	// A second signal cuts the drain short.
	sctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	tctx, tcancel := context.WithTimeout(sctx, cfg.Shutdown.DrainTimeout.D()+30*time.Second)
	defer tcancel()
	a.Shutdown(tctx, false)
	return 0
}

// banner is the role's banner as JSON (start standalone --json).
func banner(a *agent.Agent) map[string]any {
	out := map[string]any{
		"role": a.Settings().Role, "host": a.Settings().Hostname, "state_dir": a.Settings().StateDir,
		"inference": a.InferenceAddr(), "management": a.ManagementAddr(), "version": version.Version, "commit": version.GetCommit(),
	}
	if list, err := a.Engines.List(); err == nil {
		names := make([]string, 0, len(list))
		for _, e := range list {
			names = append(names, e.Name)
		}
		out["engines"] = names
		if len(list) == 0 {
			out["hint"] = noEngineHint
		}
	}
	return out
}
