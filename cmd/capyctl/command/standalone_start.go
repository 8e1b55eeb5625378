// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/capyctl/capyctl/core/agent"
	"github.com/capyctl/capyctl/core/config"
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

// loadRoleConfig parses the role flags and loads the configuration.
func (c *Meta) loadRoleConfig(name, role string, args []string) (*config.Config, []string, int) {
	fs := c.FlagSet(name)
	var cfgFile string
	fs.StringVar(&cfgFile, "config", "", "")
	vals := map[string]*string{}
	for flagName := range roleFlags {
		v := new(string)
		vals[flagName] = v
		fs.StringVar(v, flagName, "", "")
	}
	var sets stringList
	fs.Var(&sets, "set", "")
	rest, code := c.parse(fs, args)
	if code != 0 {
		return nil, nil, helpOr(code)
	}
	flags := map[string]string{"role": role}
	for flagName, v := range vals {
		if *v != "" {
			flags[roleFlags[flagName]] = *v
		}
	}
	for _, s := range sets {
		k, v, ok := strings.Cut(s, "=")
		if !ok {
			return nil, nil, c.Usage("--set %q is not PATH=VALUE", s)
		}
		flags[k] = v
	}
	if c.stateDir != "" {
		flags["state_dir"] = c.stateDir
	}
	if cfgFile == "" {
		cfgFile = c.Getenv("CAPYCTL_CONFIG")
	}
	cfg, err := config.Load(config.LoadOptions{File: cfgFile, Env: os.Environ(), Flags: flags})
	if err != nil {
		return nil, nil, c.Fail(err)
	}
	return cfg, rest, 0
}

// settingsFromConfig turns a role configuration into the agent's settings.
func settingsFromConfig(cfg *config.Config) agent.Settings {
	return agent.Settings{
		Role:             cfg.Role,
		StateDir:         cfg.StateDir,
		Listen:           cfg.Listen,
		ManagementListen: cfg.ManagementListen,
		PluginDir:        cfg.PluginDir,
		ModelsRoot:       cfg.ModelsRoot,
		EnginePorts:      fmt.Sprintf("%d-%d", cfg.EnginePorts.First, cfg.EnginePorts.Last),
		Hostname:         cfg.Hostname,
		EngineTelemetry:  cfg.EngineTelemetry,
		EngineLogs:       cfg.EngineLogs,
		Retention:        cfg.Retention,
		MaxBodyBytes:     int64(cfg.Limits.MaxBodyBytes),
		RequestDeadline:  cfg.Limits.RequestDeadline.D(),
		DrainTimeout:     cfg.Shutdown.DrainTimeout.D(),
		GPU: agent.GPUSettings{
			Provider: cfg.GPU.Provider, SimState: cfg.GPU.SimState, SimDevices: cfg.GPU.SimDevices,
			SimDeviceMemory: int64(cfg.GPU.SimDeviceMemory), SimUnified: cfg.GPU.SimUnified,
		},
		Memory: cfg.Memory,
	}
}

// Run implements cli.Command.
func (c *StandaloneStartCommand) Run(args []string) int {
	cfg, _, code := c.loadRoleConfig("start standalone", "standalone", args)
	if cfg == nil {
		return code
	}
	logger := roleLogger(cfg.LogLevel, cfg.LogFormat, c.Err)
	a, err := agent.New(settingsFromConfig(cfg), logger)
	if err != nil {
		return c.Fail(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := a.Start(ctx); err != nil {
		a.Shutdown(context.Background(), false)
		return c.Fail(err)
	}
	a.Banner(c.Out)
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
