// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"context"
	"errors"
	"flag"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/capyctl/capyctl/core/agent"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/config"
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
	"listen":              "listen",
	"management-listen":   "management_listen",
	"models-root":         "models_root",
	"engine-ports":        "engine_ports",
	"plugin-dir":          "plugin_dir",
	"gpu-provider":        "gpu.provider",
	"engine-logs":         "engine_logs",
	"engine-telemetry":    "engine_telemetry",
	"retention":           "retention",
	"log-level":           "log_level",
	"log-format":          "log_format",
	"hostname":            "hostname",
	"server":              "server_address",
	"cluster-listen":      "cluster_listen",
	"peer-address":        "peer_address",
	"rendezvous-ports":    "rendezvous_ports",
	"require-rdma":        "require_rdma",
	"group-stall-timeout": "group_stall_timeout",
	"bootstrap-expect":    "bootstrap_expect",
	"join":                "server_join",
}

// roleOptions are the role flags of `start <role>` and `config show`.
type roleOptions struct {
	cfgFile string
	// joinToken and joinTokenFile are start host's one-time join token.
	joinToken     string
	joinTokenFile string
	vals          map[string]*string
	sets          stringList
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
	fs.StringVar(&o.joinToken, "join-token", "", "")
	fs.StringVar(&o.joinTokenFile, "join-token-file", "", "")
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
	cfg, rc, _, code := c.loadRoleConfigOpts(name, role, args)
	return cfg, rc, code
}

// loadRoleConfigOpts is loadRoleConfig that also returns the options the
// configuration does not hold (the join token).
func (c *Meta) loadRoleConfigOpts(name, role string, args []string) (*config.Config, *wire.RoleConfig, *roleOptions, int) {
	fs := c.FlagSet(name)
	o := addRoleFlags(fs)
	if _, code := c.parse(fs, args); code != 0 {
		return nil, nil, nil, helpOr(code)
	}
	cfg, file, err := c.loadConfig(o, role)
	if err != nil {
		return nil, nil, nil, c.Fail(err)
	}
	return cfg, roleConfigOf(cfg, file), o, 0
}

// joinToken is the host's join token: --join-token, else the file of
// --join-token-file, else CAPYCTL_JOIN_TOKEN. IMPORTANT: prefer the file
// or the variable; a flag shows on the machine's process list while the
// host joins.
func (c *Meta) joinToken(o *roleOptions) (string, error) {
	switch {
	case o.joinToken != "":
		return o.joinToken, nil
	case o.joinTokenFile != "":
		data, err := os.ReadFile(o.joinTokenFile)
		if err != nil {
			return "", structs.Errf(structs.CodeInvalidConfig, "join token file %s: %v", o.joinTokenFile, errors.Unwrap(err))
		}
		return strings.TrimSpace(string(data)), nil
	}
	return strings.TrimSpace(c.Getenv("CAPYCTL_JOIN_TOKEN")), nil
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

// Run implements cli.Command.
func (c *StandaloneStartCommand) Run(args []string) int { return c.runRole("standalone", args) }

// runRole runs a role until SIGINT or SIGTERM: start standalone, start
// server and start host.
func (c *Meta) runRole(role string, args []string) int {
	cfg, rc, o, code := c.loadRoleConfigOpts("start "+role, role, args)
	if cfg == nil {
		return code
	}
	logger := roleLogger(cfg.LogLevel, cfg.LogFormat, c.Err)
	settings := agent.SettingsFromConfig(cfg)
	settings.Config = rc
	if role == config.RoleHost {
		if cfg.ServerAddress == "" {
			return c.Fail(structs.Errf(structs.CodeInvalidConfig,
				"a host needs its server's cluster address: --server ADDR, server_address in its configuration, or CAPYCTL_SERVER_ADDRESS"))
		}
		tok, err := c.joinToken(o)
		if err != nil {
			return c.Fail(err)
		}
		settings.JoinToken = tok
	}
	if role == config.RoleServer && cfg.ServerJoin != "" {
		tok, err := c.joinToken(o)
		if err != nil {
			return c.Fail(err)
		}
		settings.JoinToken = tok
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := agent.Run(ctx, agent.Options{
		Settings: settings, Logger: logger,
		Ready: func(ctx context.Context, r agent.Running) error {
			if c.JSON() {
				c.PrintJSON(banner(r))
			} else {
				r.Banner(c.Out)
			}
			logger.Info("role started", "role", role, "inference", r.InferenceAddr(), "management", r.ManagementAddr())
			return nil
		},
		Stopping: func() (context.Context, context.CancelFunc) {
			stop()
			logger.Info("stopping the role; engines keep running")
			// A second signal cuts the drain short.
			sctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			tctx, tcancel := context.WithTimeout(sctx, cfg.Shutdown.DrainTimeout.D()+30*time.Second)
			return tctx, func() { tcancel(); cancel() }
		},
	})
	if err != nil {
		return c.Fail(err)
	}
	return 0
}

// banner is the role's banner as JSON (start standalone --json).
func banner(r agent.Running) map[string]any {
	s := r.Settings()
	out := map[string]any{
		"role": s.Role, "host": s.Hostname, "state_dir": s.StateDir,
		"inference": r.InferenceAddr(), "management": r.ManagementAddr(), "version": version.Version, "commit": version.GetCommit(),
	}
	if names, err := r.EngineNames(); err == nil {
		out["engines"] = names
		if len(names) == 0 {
			out["hint"] = noEngineHint
		}
	}
	return out
}
