// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package config is a role's configuration: every setting, its type,
// default and description (the registry, Definitions), and Load, which
// reads them from a flag, an environment variable (CAPYCTL_<PATH>), an HCL
// file or the default, in that order of precedence, and remembers where
// each value came from for `capyctl config show`.
package config

import (
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/capyctl/capyctl/core/structs"
)

// Roles.
const (
	RoleStandalone = "standalone"
	RoleServer     = "server"
	RoleHost       = "host"
)

// Roles lists the roles a configuration can describe.
var Roles = []string{RoleStandalone, RoleServer, RoleHost}

// Sources of a value, from the weakest to the strongest.
const (
	FromDefault = "default"
	FromFile    = "file"
	FromEnv     = "env"
	FromFlag    = "flag"
)

// Config is a role's effective configuration.
type Config struct {
	Role             string
	StateDir         string
	Listen           string
	ManagementListen string
	// ClusterListen and ClusterAdvertise are the server's cluster
	// listener and the address hosts are told to dial.
	ClusterListen    string
	ClusterAdvertise string
	// HostHeartbeat is the server's heartbeat interval for its hosts.
	HostHeartbeat structs.Duration
	// ServerAddress is the server a host dials.
	ServerAddress string
	// BootstrapExpect is the number of servers of the server cluster (1:
	// a server alone, no raft); ServerJoin the cluster address of a
	// server this one joins.
	BootstrapExpect int
	ServerJoin      string
	// PeerAddress, RendezvousPorts and RequireRDMA are a host's group
	// settings; GroupStallTimeout the server's bound on a group bring-up.
	PeerAddress       string
	RendezvousPorts   PortRange
	RequireRDMA       bool
	GroupStallTimeout structs.Duration
	// RescheduleAfter is how long a server's leader waits for a lost host
	// before it places the host's instances elsewhere (0: never).
	RescheduleAfter structs.Duration
	// AdoptHostDeployments lets a server adopt the deployments a host
	// made itself.
	AdoptHostDeployments bool
	PluginDir            string
	ModelsRoot           string
	EnginePorts          PortRange
	Hostname             string
	LogLevel             string
	LogFormat            string
	// EngineTelemetry is "off" (engines get DO_NOT_TRACK=1 and friends) or
	// "allow".
	EngineTelemetry string
	// EngineLogs is "file" or "memory" (the last 4 MiB per launch, never
	// on disk).
	EngineLogs string
	// LMCache is "auto" (each deployment decides) or "off" (no LMCache
	// on this host).
	LMCache string
	// Retention is "standard" or "zero" (engine logs in memory, no core
	// dumps, no LMCache).
	Retention         string
	GPU               GPUConfig
	Memory            MemoryConfig
	LifecycleDefaults LifecycleDefaults
	Switching         Switching
	Limits            Limits
	Listener          Listener
	TLS               TLS
	Shutdown          Shutdown
	RequestLedger     RequestLedger
	Responses         Responses
	Usage             Usage
	Drivers           Drivers

	sources map[string]Source
}

// GPUConfig selects the GPU provider; the sim_* settings shape the
// simulated one.
type GPUConfig struct {
	// Provider is "auto", "nvml", "simulated" or "none".
	Provider        string
	SimState        string
	SimDevices      int
	SimDeviceMemory structs.ByteSize
	SimUnified      bool
}

// MemoryConfig holds the limits of the memory domains.
type MemoryConfig struct {
	System DomainLimits
	GPU    DomainLimits
}

// DomainLimits are a memory domain's managed limit and free reserve.
type DomainLimits struct {
	ManagedLimit Amount
	FreeReserve  Amount
}

// LifecycleDefaults apply to deployments that leave their idle timers out;
// 0 is off.
type LifecycleDefaults struct {
	ReadyIdleTimeout  structs.Duration
	ParkedIdleTimeout structs.Duration
}

// Switching is how models that compete for one card take turns.
type Switching struct {
	// Policy is "turns" (a request for a model that must wait for busy
	// models waits for their turns) or "immediate" (it is refused at once,
	// capacity_blocked: the policy before turns).
	Policy string
	// TurnTime bounds a busy model's turn once another model waits.
	TurnTime structs.Duration
	// TurnRequests bounds the requests a busy model still admits once
	// another model waits (0: no bound but the time).
	TurnRequests int
}

// Limits bound the router's queues and request bodies.
type Limits struct {
	// ProgressInterval spaces the SSE progress comments of a waiting
	// streamed request.
	ProgressInterval structs.Duration
	MaxWaitingTotal  int
	MaxWaitingBytes  structs.ByteSize
	RequestDeadline  structs.Duration
	MaxBodyBytes     structs.ByteSize
	// MaxBodyBytesInFlight bounds the request bodies held in memory, all
	// together (429 bodies_in_flight_full past it).
	MaxBodyBytesInFlight structs.ByteSize
}

// Listener bounds the connections of each listener (inference and
// management) and how long a client may take.
type Listener struct {
	ReadHeaderTimeout            structs.Duration
	IdleTimeout                  structs.Duration
	BodyReadTimeout              structs.Duration
	MaxConnections               int
	MaxUnauthenticatedPerAddress int
	// AuthFailuresPerMinute bounds the failed inference authentications
	// of one client address (0: no bound).
	AuthFailuresPerMinute int
}

// TLS is the inference endpoint's certificate: empty CertFile serves plain
// HTTP.
type TLS struct {
	CertFile     string
	KeyFile      string
	ClientCAFile string
}

// Shutdown bounds a role's stop.
type Shutdown struct {
	DrainTimeout structs.Duration
}

// Drivers bound the calls to driver plugins by kind and set how drivers are
// pinged (a driver that stops answering is killed and relaunched).
type Drivers struct {
	CallTimeout  structs.Duration
	PlanTimeout  structs.Duration
	StartTimeout structs.Duration
	ParkTimeout  structs.Duration
	StopTimeout  structs.Duration
	PingInterval structs.Duration
	PingTimeout  structs.Duration
}

// RequestLedger configures the request ledger.
type RequestLedger struct {
	Enabled    bool
	Retention  structs.Duration
	MaxRecords int
}

// Responses configures the Responses API's stored responses.
type Responses struct {
	// Retention is how long a stored response is kept; 0 keeps none.
	Retention structs.Duration
	// MaxBytes bounds the stored responses, all together (oldest out).
	MaxBytes structs.ByteSize
}

// Usage configures the API keys' usage records.
type Usage struct {
	// Retention is how long rows (per key, model and hour) are kept.
	Retention structs.Duration
}

// Source says where a setting's value came from.
type Source struct {
	// Value is the effective value, as it would be written in the file.
	Value string `json:"value"`
	// From is "default", "file", "env" or "flag".
	From string `json:"from"`
	// Detail: "env CAPYCTL_LISTEN", "flag listen", "role.hcl:12", or how
	// a default was derived.
	Detail string `json:"detail,omitempty"`
}

// Setting is one row of `capyctl config show`.
type Setting struct {
	Path        string `json:"path"`
	Env         string `json:"env"`
	Value       string `json:"value"`
	Default     string `json:"default"`
	From        string `json:"from"`
	Detail      string `json:"detail,omitempty"`
	Description string `json:"description"`
}

// LoadOptions are Load's inputs.
type LoadOptions struct {
	// File is an HCL role configuration ("" for none); a name ending in
	// ".json" is read as HCL's JSON syntax.
	File string
	// Env is the environment, in os.Environ's "KEY=value" form. Only
	// CAPYCTL_* variables of known settings are read, and HOME and
	// XDG_STATE_HOME for the defaults; nil reads nothing (pass
	// os.Environ() in a program).
	Env []string
	// Flags maps a setting's path to a value given on the command line
	// ("listen": "127.0.0.1:9443", "gpu.provider": "simulated").
	Flags map[string]string
}

// Provenance returns every setting's effective value and source, by path.
func (c *Config) Provenance() map[string]Source {
	out := make(map[string]Source, len(c.sources))
	for k, v := range c.sources {
		out[k] = v
	}
	return out
}

// Settings returns every setting with its value, default, source and
// description, sorted by path.
func (c *Config) Settings() []Setting {
	out := make([]Setting, 0, len(registry))
	for _, d := range registry {
		src := c.sources[d.Path]
		out = append(out, Setting{
			Path: d.Path, Env: d.Env, Value: src.Value, Default: d.DefaultText(),
			From: src.From, Detail: src.Detail, Description: d.Description,
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// Load builds the effective configuration: for each setting, a flag, else
// its environment variable, else the file, else the default. Every
// refusal is an invalid_config *structs.Error naming the setting and where
// its value came from.
func Load(opts LoadOptions) (*Config, error) {
	env := envMap(opts.Env)
	var problems []Problem
	var file map[string]fileValue
	if opts.File != "" {
		var fp []Problem
		file, fp = readFile(opts.File)
		problems = append(problems, fp...)
	}
	for path := range opts.Flags {
		if lookup(path) == nil {
			problems = append(problems, Problem{Setting: path, From: FromFlag, Detail: "flag " + path,
				Message: fmt.Sprintf("unknown setting %q (capyctl config show lists them)", path)})
		}
	}
	if len(problems) > 0 {
		return nil, problemError(problems)
	}

	c := &Config{sources: map[string]Source{}}
	ctx := &loadContext{env: env, home: home(env)}
	for _, d := range registry {
		var src Source
		var value string
		if v, ok := opts.Flags[d.Path]; ok {
			value, src = v, Source{From: FromFlag, Detail: "flag " + d.Path}
		} else if v, ok := env[d.Env]; ok && v != "" {
			value, src = v, Source{From: FromEnv, Detail: "env " + d.Env}
		} else if fv, ok := file[d.Path]; ok {
			value, src = fv.value, Source{From: FromFile, Detail: fv.where}
		} else {
			value, src = d.Default, Source{From: FromDefault}
			if d.computed != nil {
				value, src.Detail = d.computed(c, ctx)
			}
		}
		shown, err := d.parse(c, ctx, value)
		if err != nil {
			problems = append(problems, Problem{Setting: d.Path, Value: value, From: src.From, Detail: src.Detail, Message: err.Error()})
			continue
		}
		src.Value = shown
		c.sources[d.Path] = src
	}
	if len(problems) > 0 {
		return nil, problemError(problems)
	}
	if problems := c.check(); len(problems) > 0 {
		return nil, problemError(problems)
	}
	return c, nil
}

// check refuses settings that do not fit together.
func (c *Config) check() []Problem {
	var out []Problem
	bad := func(path, format string, args ...any) {
		src := c.sources[path]
		out = append(out, Problem{Setting: path, Value: src.Value, From: src.From, Detail: src.Detail, Message: fmt.Sprintf(format, args...)})
	}
	for _, dom := range []struct {
		name string
		l    DomainLimits
	}{{"system", c.Memory.System}, {"gpu", c.Memory.GPU}} {
		if dom.l.ManagedLimit.IsPercent() && dom.l.FreeReserve.IsPercent() && dom.l.ManagedLimit.Percent+dom.l.FreeReserve.Percent > 100 {
			bad("memory."+dom.name+".free_reserve",
				"managed_limit %s and free_reserve %s add up to more than 100%% of the %s memory; the limit could never be reached",
				dom.l.ManagedLimit, dom.l.FreeReserve, dom.name)
		}
	}
	if _, port, err := parseAddr(c.Listen); err == nil && c.EnginePorts.Contains(port) {
		bad("engine_ports", "the range %s holds the inference port %d (listen)", c.EnginePorts, port)
	}
	if _, port, err := parseAddr(c.ManagementListen); err == nil && c.EnginePorts.Contains(port) {
		bad("engine_ports", "the range %s holds the management port %d (management_listen)", c.EnginePorts, port)
	}
	if _, port, err := parseAddr(c.Listen); err == nil && port != 0 && c.Listen == c.ManagementListen {
		bad("management_listen", "the management API and the inference endpoint cannot share %s", c.Listen)
	}
	if c.Limits.MaxBodyBytes > c.Limits.MaxWaitingBytes {
		bad("limits.max_body_bytes", "one body (%s) is larger than all waiting bodies together may be (limits.max_waiting_bytes %s)",
			c.Limits.MaxBodyBytes, c.Limits.MaxWaitingBytes)
	}
	if c.Limits.MaxBodyBytes > c.Limits.MaxBodyBytesInFlight {
		bad("limits.max_body_bytes_in_flight", "all bodies in flight together (%s) cannot hold one of limits.max_body_bytes (%s)",
			c.Limits.MaxBodyBytesInFlight, c.Limits.MaxBodyBytes)
	}
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		path := "tls.key_file"
		if c.TLS.CertFile == "" {
			path = "tls.cert_file"
		}
		bad(path, "TLS needs both tls.cert_file and tls.key_file")
	}
	if c.TLS.ClientCAFile != "" && c.TLS.CertFile == "" {
		bad("tls.client_ca_file", "client certificates need TLS: set tls.cert_file and tls.key_file")
	}
	if c.Retention == "zero" && c.EngineLogs == "file" {
		if c.sources["engine_logs"].From == FromDefault {
			c.EngineLogs = "memory"
			c.sources["engine_logs"] = Source{Value: "memory", From: FromDefault, Detail: "retention = zero keeps engine logs in memory"}
		} else {
			bad("engine_logs", "retention = zero keeps engine logs in memory only; drop engine_logs = file or the zero retention")
		}
	}
	if c.Retention == "zero" && c.Responses.Retention != 0 {
		// Stored responses hold prompts and answers: zero retention keeps none.
		if src, ok := c.sources["responses.retention"]; !ok || src.From == FromDefault {
			c.Responses.Retention = 0
			c.sources["responses.retention"] = Source{Value: "0s", From: FromDefault, Detail: "retention = zero stores no response"}
		} else {
			bad("responses.retention", "retention = zero stores no response (they hold prompts and answers); drop responses.retention or the zero retention")
		}
	}
	if c.RequestLedger.Enabled && (c.RequestLedger.MaxRecords == 0 || c.RequestLedger.Retention == 0) {
		path := "request_ledger.max_records"
		if c.RequestLedger.Retention == 0 {
			path = "request_ledger.retention"
		}
		bad(path, "an enabled ledger keeps something; set request_ledger.enabled = false to keep no records")
	}
	if c.GPU.Provider != "simulated" && c.GPU.SimState != "" && c.sources["gpu.sim_state"].From != FromDefault {
		bad("gpu.sim_state", "sim_state applies to the simulated provider only (gpu.provider = %q)", c.GPU.Provider)
	}
	return out
}

// Problem is one refused setting, in an error's Details["problems"].
type Problem struct {
	Setting string `json:"setting,omitempty"`
	Value   string `json:"value,omitempty"`
	From    string `json:"from"`
	Detail  string `json:"detail,omitempty"`
	Message string `json:"message"`
}

// String renders `setting "value" (env CAPYCTL_X): message`.
func (p Problem) String() string {
	var b strings.Builder
	if p.Setting != "" {
		fmt.Fprintf(&b, "setting %s", p.Setting)
		if p.Value != "" {
			fmt.Fprintf(&b, " = %q", p.Value)
		}
		where := p.Detail
		if where == "" {
			where = p.From
		}
		fmt.Fprintf(&b, " (%s): ", where)
	} else if p.Detail != "" {
		b.WriteString(p.Detail + ": ")
	}
	b.WriteString(p.Message)
	return b.String()
}

func problemError(ps []Problem) *structs.Error {
	msg := ps[0].String()
	if n := len(ps) - 1; n > 0 {
		msg = fmt.Sprintf("%s (and %d more)", msg, n)
	}
	e := structs.Errf(structs.CodeInvalidConfig, "%s", msg).WithDetail("problems", ps)
	if ps[0].Setting != "" {
		e.WithDetail("setting", ps[0].Setting)
	}
	e.WithDetail("source", ps[0].From)
	return e
}

// loadContext is what defaults and parsers may consult.
type loadContext struct {
	env  map[string]string
	home string
}

func envMap(list []string) map[string]string {
	out := map[string]string{}
	for _, kv := range list {
		if k, v, ok := strings.Cut(kv, "="); ok {
			out[k] = v
		}
	}
	return out
}

// home is $HOME from the given environment, else the process's.
func home(env map[string]string) string {
	if h := env["HOME"]; h != "" {
		return h
	}
	h, _ := os.UserHomeDir()
	return h
}
