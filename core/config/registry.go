// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/capyctl/capyctl/core/structs"
)

// Kinds of values, for the docs and the commented default file.
const (
	KindString   = "string"
	KindEnum     = "enum"
	KindPath     = "path"
	KindAddress  = "address"
	KindPorts    = "port range"
	KindInt      = "int"
	KindBool     = "bool"
	KindSize     = "size"
	KindDuration = "duration"
	KindAmount   = "auto | size | percent"
)

// Definition is one setting of the registry.
type Definition struct {
	// Path is the setting's name in the file ("gpu.provider"): attribute
	// gpu's provider inside a gpu { } block.
	Path string
	// Env is the environment variable that sets it (CAPYCTL_GPU_PROVIDER).
	Env string
	// Default is the value when no source sets it ("" for a default
	// derived at load; see DefaultText).
	Default string
	// Description is one line for `config show`, the docs and the default
	// file.
	Description string
	Kind        string
	// Values are an enum's allowed values.
	Values []string
	// Roles are the roles the setting matters to; every role accepts
	// every setting.
	Roles []string

	defaultText string
	// example is the commented value of a derived default.
	example  string
	computed func(c *Config, ctx *loadContext) (value, detail string)
	parse    func(c *Config, ctx *loadContext, v string) (shown string, err error)
}

// DefaultText describes the default for people.
func (d Definition) DefaultText() string {
	if d.defaultText != "" {
		return d.defaultText
	}
	return d.Default
}

// AppliesTo reports whether the setting matters to role.
func (d Definition) AppliesTo(role string) bool { return slices.Contains(d.Roles, role) }

// Definitions returns the registry: every setting, in file order.
func Definitions() []Definition { return slices.Clone(registry) }

// EnvName returns the environment variable of a setting path.
func EnvName(path string) string {
	return "CAPYCTL_" + strings.ToUpper(strings.ReplaceAll(path, ".", "_"))
}

func lookup(path string) *Definition {
	for i := range registry {
		if registry[i].Path == path {
			return &registry[i]
		}
	}
	return nil
}

var (
	all        = []string{RoleStandalone, RoleServer, RoleHost}
	engineSide = []string{RoleStandalone, RoleHost}
	routerSide = []string{RoleStandalone, RoleServer}
	hostnameRe = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*$`)
)

// registry lists every setting. IMPORTANT: paths and environment names
// are a public contract (files, units, scripts); add, never rename. Order
// matters where a default derives from an earlier setting (plugin_dir from
// state_dir).
var registry = []Definition{
	enumSetting("role", RoleStandalone, "the role this configuration runs", all, Roles,
		func(c *Config) *string { return &c.Role }),
	{
		Path: "state_dir", Kind: KindPath, Roles: all,
		Description: "where the store, engine logs and runtime files live (created 0700)",
		defaultText: "$XDG_STATE_HOME/capyctl, else ~/.local/state/capyctl",
		example:     "~/.local/state/capyctl",
		computed: func(c *Config, ctx *loadContext) (string, string) {
			if x := ctx.env["XDG_STATE_HOME"]; x != "" {
				return filepath.Join(x, "capyctl"), "$XDG_STATE_HOME/capyctl"
			}
			return "~/.local/state/capyctl", "~/.local/state/capyctl"
		},
		parse: pathParser(func(c *Config) *string { return &c.StateDir }, false),
	},
	func() Definition {
		d := addrSetting("listen", "0.0.0.0:8443", "the inference endpoint's address (the API key is always required); a host's own endpoint is on loopback by default, since the server reaches the host over the host's own connection", all, false,
			func(c *Config) *string { return &c.Listen })
		d.defaultText = "0.0.0.0:8443; 127.0.0.1:8443 on a host"
		// A host's own endpoint serves only who reaches it directly: the
		// server relays over the connection the host opened. Open to the
		// network, it would be a second door to the host's models that no
		// placement or the server's limits guard.
		d.computed = func(c *Config, _ *loadContext) (string, string) {
			if c.Role == RoleHost {
				return "127.0.0.1:8443", "a host's own endpoint: loopback"
			}
			return "0.0.0.0:8443", ""
		}
		return d
	}(),
	addrSetting("management_listen", "127.0.0.1:7443", "the management API's address; loopback only", all, true,
		func(c *Config) *string { return &c.ManagementListen }),
	addrSetting("cluster_listen", "0.0.0.0:8444", "the address GPU hosts dial: joining, the host link and the relay, mutual TLS only", []string{RoleServer}, false,
		func(c *Config) *string { return &c.ClusterListen }),
	optionalAddrSetting("cluster_advertise", "the address hosts are told to dial (join tokens print it, the server certificate names it)",
		"cluster_listen, with this machine's name for 0.0.0.0", []string{RoleServer}, func(c *Config) *string { return &c.ClusterAdvertise }),
	intSetting("bootstrap_expect", 1, 1, 9,
		"the number of servers of the server cluster: the first server of a cluster starts with it (above 1 it bootstraps raft); until that many are voters the cluster says it is degraded; 1 is a server alone",
		[]string{RoleServer}, func(c *Config) *int { return &c.BootstrapExpect }),
	{
		Path: "server_join", Kind: KindAddress, Roles: []string{RoleServer},
		Description: "the cluster addresses of running servers this server joins, comma-separated: the first that answers is used, another one when it is out of reach (with a server join token: capyctl create join-token --role server)",
		defaultText: "none: this server is the first of its cluster, or alone", example: "s1.example.com:8444,s2.example.com:8444",
		computed: func(*Config, *loadContext) (string, string) {
			return "", "none: this server is the first of its cluster, or alone"
		},
		parse: func(c *Config, _ *loadContext, v string) (string, error) {
			var addrs []string
			for _, a := range strings.Split(v, ",") {
				if a = strings.TrimSpace(a); a == "" {
					continue
				}
				if _, _, err := parseAddr(a); err != nil {
					return v, err
				}
				addrs = append(addrs, a)
			}
			c.ServerJoin = strings.Join(addrs, ",")
			return c.ServerJoin, nil
		},
	},
	optionalAddrSetting("server_address", "the server's cluster address this host joins and dials (its cluster_listen)",
		"none: a host needs one", []string{RoleHost}, func(c *Config) *string { return &c.ServerAddress }),
	{
		Path: "peer_address", Kind: KindString, Roles: []string{RoleHost},
		Description: "this host's address on the group link (its direct link to the other GPU hosts): group engines meet and talk there, unauthenticated, so name an address only the GPU hosts reach; a group member on a host without one is refused (peer_address_missing)",
		defaultText: "none: this host runs no group member until it is set",
		parse: func(c *Config, _ *loadContext, v string) (string, error) {
			v = strings.TrimSpace(v)
			c.PeerAddress = v
			if v != "" && (strings.ContainsAny(v, " /:") && net.ParseIP(v) == nil) {
				return v, fmt.Errorf("%q is not an IP address or a host name", v)
			}
			return v, nil
		},
	},
	{
		Path: "rendezvous_ports", Kind: KindPorts, Default: "25000-25099", Roles: []string{RoleHost},
		Description: "ports a group head's engines meet on, first-last, on peer_address: each head takes seven (torch.distributed's store and the six SGLang binds after it with DP attention)",
		parse: func(c *Config, _ *loadContext, v string) (string, error) {
			r, err := ParsePortRange(v)
			c.RendezvousPorts = r
			return r.String(), err
		},
	},
	boolSetting("require_rdma", false, "a group member's NCCL traffic must go over RDMA: its engine runs with NCCL_NET=IB and fails to start rather than fall back to TCP (rendezvous and Gloo traffic stay on TCP)", []string{RoleHost},
		func(c *Config) *bool { return &c.RequireRDMA }),
	boolSetting("adopt_host_deployments", true, "the server adopts a deployment a host made itself (on its own management API, or before it joined): listed and routed under its own model names, never one another deployment serves; false: a host serves only what the servers placed on it (the trust model: a compromised host cannot publish a model name)", []string{RoleServer},
		func(c *Config) *bool { return &c.AdoptHostDeployments }),
	durationSetting("reschedule_after", "5m", true,
		"how long the leader waits for a lost host before it places the host's instances on other hosts that fit (its old copies are stopped when it returns; a group stays down, the reason in its status); \"0s\" never moves them",
		[]string{RoleServer}, func(c *Config) *structs.Duration { return &c.RescheduleAfter }),
	durationSetting("group_stall_timeout", "120s", false,
		"how long a group's bring-up may go without its head becoming ready before the group is stopped (group_stalled)", []string{RoleServer},
		func(c *Config) *structs.Duration { return &c.GroupStallTimeout }),
	{
		Path: "plugin_dir", Kind: KindPath, Roles: engineSide,
		Description: "where third-party drivers (capyctl-driver-<name>) are found",
		defaultText: "<state_dir>/plugins",
		example:     "~/.local/state/capyctl/plugins",
		computed: func(c *Config, ctx *loadContext) (string, string) {
			return filepath.Join(c.StateDir, "plugins"), "<state_dir>/plugins"
		},
		parse: pathParser(func(c *Config) *string { return &c.PluginDir }, false),
	},
	{
		Path: "models_root", Kind: KindPath, Default: "~/models", Roles: engineSide,
		Description: "the model store: relative model paths and Hugging Face downloads live here",
		parse:       pathParser(func(c *Config) *string { return &c.ModelsRoot }, false),
	},
	{
		Path: "engine_ports", Kind: KindPorts, Default: "8100-8199", Roles: engineSide,
		Description: "loopback ports leased to engines, first-last",
		parse: func(c *Config, _ *loadContext, v string) (string, error) {
			r, err := ParsePortRange(v)
			c.EnginePorts = r
			return r.String(), err
		},
	},
	{
		Path: "hostname", Kind: KindString, Roles: all,
		Description: "this machine's name in the state; a change is refused (host_name_changed)",
		defaultText: "the machine's hostname",
		example:     "gpu-a",
		computed: func(c *Config, ctx *loadContext) (string, string) {
			h, err := os.Hostname()
			if err != nil {
				return "localhost", "os.Hostname failed: " + err.Error()
			}
			return h, "os.Hostname"
		},
		parse: func(c *Config, _ *loadContext, v string) (string, error) {
			v = strings.TrimSpace(v)
			if len(v) > 253 || !hostnameRe.MatchString(v) {
				return v, fmt.Errorf("%q is not a hostname", v)
			}
			c.Hostname = v
			return v, nil
		},
	},
	enumSetting("log_level", "info", "the role's log level", all, []string{"trace", "debug", "info", "warn", "error"},
		func(c *Config) *string { return &c.LogLevel }),
	enumSetting("log_format", "auto", "text on a terminal and JSON lines otherwise (auto), or always one", all,
		[]string{"auto", "text", "json"}, func(c *Config) *string { return &c.LogFormat }),
	enumSetting("engine_telemetry", "off", "off gives every engine DO_NOT_TRACK=1 (and vLLM's own opt-outs); allow leaves them out", engineSide,
		[]string{"off", "allow"}, func(c *Config) *string { return &c.EngineTelemetry }),
	enumSetting("engine_logs", "file", "engine output to <state_dir>/logs (file) or the last 4 MiB per launch in memory only", engineSide,
		[]string{"file", "memory"}, func(c *Config) *string { return &c.EngineLogs }),
	enumSetting("lmcache", "auto", "off runs no LMCache for any deployment on this host; auto leaves it to each deployment's lmcache", engineSide,
		[]string{"auto", "off"}, func(c *Config) *string { return &c.LMCache }),
	enumSetting("retention", "standard", "zero keeps engine logs in memory, writes no core dumps and starts no LMCache", all,
		[]string{"standard", "zero"}, func(c *Config) *string { return &c.Retention }),

	enumSetting("gpu.provider", "auto", "GPU inventory: NVML when present (auto), NVML, the simulated GPU, or none", engineSide,
		[]string{"auto", "nvml", "simulated", "none"}, func(c *Config) *string { return &c.GPU.Provider }),
	{
		Path: "gpu.sim_state", Kind: KindPath, Roles: engineSide,
		Description: "the simulated GPU's shared state file (empty: in memory)",
		parse:       pathParser(func(c *Config) *string { return &c.GPU.SimState }, true),
	},
	intSetting("gpu.sim_devices", 1, 1, 16, "number of simulated GPUs", engineSide,
		func(c *Config) *int { return &c.GPU.SimDevices }),
	sizeSetting("gpu.sim_device_memory", "24GiB", "memory of each simulated GPU", engineSide,
		func(c *Config) *structs.ByteSize { return &c.GPU.SimDeviceMemory }),
	boolSetting("gpu.sim_unified", false, "simulate one unified memory pool instead of discrete cards", engineSide,
		func(c *Config) *bool { return &c.GPU.SimUnified }),

	amountSetting("memory.system.managed_limit", "host RAM CapyCTL may charge: auto (50%), a size or a percentage",
		func(c *Config) *Amount { return &c.Memory.System.ManagedLimit }),
	amountSetting("memory.system.free_reserve", "host RAM always left free: auto (20%), a size or a percentage",
		func(c *Config) *Amount { return &c.Memory.System.FreeReserve }),
	amountSetting("memory.gpu.managed_limit", "card memory CapyCTL may charge, per card: auto (derived), a size or a percentage",
		func(c *Config) *Amount { return &c.Memory.GPU.ManagedLimit }),
	amountSetting("memory.gpu.free_reserve", "card memory always left free, per card: auto (derived), a size or a percentage",
		func(c *Config) *Amount { return &c.Memory.GPU.FreeReserve }),

	durationSetting("lifecycle_defaults.ready_idle_timeout", "", true,
		"park (or stop) a ready model idle this long, for deployments that do not say; empty: off", routerSide,
		func(c *Config) *structs.Duration { return &c.LifecycleDefaults.ReadyIdleTimeout }),
	durationSetting("lifecycle_defaults.parked_idle_timeout", "", true,
		"stop a parked model idle this long, for deployments that do not say; empty: off", routerSide,
		func(c *Config) *structs.Duration { return &c.LifecycleDefaults.ParkedIdleTimeout }),

	enumSetting("switching.policy", "turns",
		"what a request does when its model must wait for busy models to leave the card: turns (it waits for their turns; served in batches, victims by expected cost) or immediate (it is refused at once with capacity_blocked, the policy before turns)",
		engineSide, []string{"turns", "immediate"}, func(c *Config) *string { return &c.Switching.Policy }),
	durationSetting("switching.turn_time", "30s", false,
		"how long a busy model keeps its turn once another model waits for its memory, counted from that model's longest-waiting request", engineSide,
		func(c *Config) *structs.Duration { return &c.Switching.TurnTime }),
	intSetting("switching.turn_requests", 0, 0, 1<<20,
		"how many more requests a busy model admits once another model waits for its memory; 0: no bound but switching.turn_time", engineSide,
		func(c *Config) *int { return &c.Switching.TurnRequests }),
	durationSetting("limits.progress_interval", "10s", false,
		"how often a streamed request that waits (for a place, a wake, a start or another model's turn) gets an SSE progress comment, which keeps proxies and clients that time out on silence from cutting it", all,
		func(c *Config) *structs.Duration { return &c.Limits.ProgressInterval }),
	intSetting("limits.max_waiting_total", 256, 0, 1<<20, "requests waiting for a place, all deployments together", routerSide,
		func(c *Config) *int { return &c.Limits.MaxWaitingTotal }),
	sizeSetting("limits.max_waiting_bytes", "64MiB", "bytes of waiting request bodies, all together", routerSide,
		func(c *Config) *structs.ByteSize { return &c.Limits.MaxWaitingBytes }),
	durationSetting("limits.request_deadline", "600s", false,
		"a request's bound until its first output, for deployments that do not say", routerSide,
		func(c *Config) *structs.Duration { return &c.Limits.RequestDeadline }),
	sizeSetting("limits.max_body_bytes", "64MiB", "the largest request body (413 request_too_large above)", routerSide,
		func(c *Config) *structs.ByteSize { return &c.Limits.MaxBodyBytes }),
	sizeSetting("limits.max_body_bytes_in_flight", "256MiB",
		"request bodies held in memory, all together: being received, waiting or on their way to the engine (429 bodies_in_flight_full above)", routerSide,
		func(c *Config) *structs.ByteSize { return &c.Limits.MaxBodyBytesInFlight }),

	durationSetting("listener.read_header_timeout", "10s", false,
		"the time a client may take to send a request's head, the first one of a new connection included", all,
		func(c *Config) *structs.Duration { return &c.Listener.ReadHeaderTimeout }),
	durationSetting("listener.idle_timeout", "60s", false,
		"a kept-alive connection that sends no next request this long is closed", all,
		func(c *Config) *structs.Duration { return &c.Listener.IdleTimeout }),
	durationSetting("listener.body_read_timeout", "60s", false,
		"the time a whole request body may take to arrive (408 body_read_timeout above; the connection is closed)", all,
		func(c *Config) *structs.Duration { return &c.Listener.BodyReadTimeout }),
	intSetting("listener.max_connections", 4096, 0, 1<<20,
		"open connections per listener (inference, management); more are closed at once; 0: no cap", all,
		func(c *Config) *int { return &c.Listener.MaxConnections }),
	intSetting("listener.max_unauthenticated_per_address", 512, 0, 1<<20,
		"connections of one client address that carried no authenticated request yet; 0: no cap (behind a reverse proxy all clients share the proxy's address)", all,
		func(c *Config) *int { return &c.Listener.MaxUnauthenticatedPerAddress }),
	intSetting("listener.auth_failures_per_minute", 30, 0, 1<<20,
		"failed inference authentications one client address may make per minute (a burst of as many); past it the address is answered 429 rate_limited until its allowance refills; 0: no bound (behind a reverse proxy all clients share the proxy's address)", routerSide,
		func(c *Config) *int { return &c.Listener.AuthFailuresPerMinute }),

	{
		Path: "tls.cert_file", Kind: KindPath, Roles: all,
		Description: "the inference endpoint's certificate (PEM, chain included); empty: plain HTTP; read again when the file changes",
		parse:       pathParser(func(c *Config) *string { return &c.TLS.CertFile }, true),
	},
	{
		Path: "tls.key_file", Kind: KindPath, Roles: all,
		Description: "the private key of tls.cert_file (PEM)",
		parse:       pathParser(func(c *Config) *string { return &c.TLS.KeyFile }, true),
	},
	{
		Path: "tls.client_ca_file", Kind: KindPath, Roles: all,
		Description: "CA certificates (PEM) that sign the clients' certificates; set: every client must present one",
		parse:       pathParser(func(c *Config) *string { return &c.TLS.ClientCAFile }, true),
	},

	durationSetting("host_heartbeat", "2s", false,
		"how often joined hosts send a heartbeat; a host silent for three is lost and its instances read uncertain", []string{RoleServer},
		func(c *Config) *structs.Duration { return &c.HostHeartbeat }),

	durationSetting("shutdown.drain_timeout", "30s", true, "how long a stopping role lets running requests finish", all,
		func(c *Config) *structs.Duration { return &c.Shutdown.DrainTimeout }),

	durationSetting("drivers.call_timeout", "15s", false,
		"bound of a quick driver call (describe, flags, load, logs, abort, liveness probe; a readiness probe adds its own wait)", engineSide,
		func(c *Config) *structs.Duration { return &c.Drivers.CallTimeout }),
	durationSetting("drivers.plan_timeout", "1m", false, "bound of a driver's plan, detect and recover calls", engineSide,
		func(c *Config) *structs.Duration { return &c.Drivers.PlanTimeout }),
	durationSetting("drivers.start_timeout", "2m", false,
		"bound of a driver's start call (spawning the engine; readiness has its own startup timeout)", engineSide,
		func(c *Config) *structs.Duration { return &c.Drivers.StartTimeout }),
	durationSetting("drivers.park_timeout", "5m", false, "bound of a driver's park and wake calls", engineSide,
		func(c *Config) *structs.Duration { return &c.Drivers.ParkTimeout }),
	durationSetting("drivers.stop_timeout", "30s", false, "bound of a driver's stop call, on top of the engine's grace period", engineSide,
		func(c *Config) *structs.Duration { return &c.Drivers.StopTimeout }),
	durationSetting("drivers.ping_interval", "5s", false,
		"how often every driver is pinged; one that misses two pings in a row is killed and relaunched", engineSide,
		func(c *Config) *structs.Duration { return &c.Drivers.PingInterval }),
	durationSetting("drivers.ping_timeout", "5s", false, "bound of one driver ping", engineSide,
		func(c *Config) *structs.Duration { return &c.Drivers.PingTimeout }),

	boolSetting("request_ledger.enabled", true, "keep a record per request (outcome, timings, bytes; never prompts)", routerSide,
		func(c *Config) *bool { return &c.RequestLedger.Enabled }),
	durationSetting("request_ledger.retention", "168h", false, "how long request records are kept (7d works too)", routerSide,
		func(c *Config) *structs.Duration { return &c.RequestLedger.Retention }),
	intSetting("request_ledger.max_records", 100_000, 0, 10_000_000, "how many request records are kept", routerSide,
		func(c *Config) *int { return &c.RequestLedger.MaxRecords }),
	durationSetting("responses.retention", "720h", false,
		"how long the Responses API keeps a stored response (store: true) for previous_response_id and GET /v1/responses/{id}; 0 keeps none", routerSide,
		func(c *Config) *structs.Duration { return &c.Responses.Retention }),
	durationSetting("usage.retention", "2160h", false,
		"how long the API keys' usage (per key, model and hour) is kept; 90 days by default, and at least as long as the monthly budgets need (a month)", routerSide,
		func(c *Config) *structs.Duration { return &c.Usage.Retention }),
	sizeSetting("responses.max_bytes", "1GiB", "the stored responses' bound, all together: the oldest go first", routerSide,
		func(c *Config) *structs.ByteSize { return &c.Responses.MaxBytes }),
}

func init() {
	for i := range registry {
		registry[i].Env = EnvName(registry[i].Path)
	}
}

func enumSetting(path, def, desc string, roles, values []string, field func(*Config) *string) Definition {
	return Definition{
		Path: path, Default: def, Description: desc, Kind: KindEnum, Values: values, Roles: roles,
		parse: func(c *Config, _ *loadContext, v string) (string, error) {
			v = strings.TrimSpace(v)
			if !slices.Contains(values, v) {
				return v, fmt.Errorf("%q is not one of %s", v, strings.Join(values, ", "))
			}
			*field(c) = v
			return v, nil
		},
	}
}

// optionalAddrSetting is an address with no default value ("" until set);
// defaultText says what stands in for it.
func optionalAddrSetting(path, desc, defaultText string, roles []string, field func(*Config) *string) Definition {
	return Definition{
		Path: path, Kind: KindAddress, Roles: roles, Description: desc,
		defaultText: defaultText, example: "gpu-server.example.com:8444",
		computed: func(*Config, *loadContext) (string, string) { return "", defaultText },
		parse: func(c *Config, _ *loadContext, v string) (string, error) {
			v = strings.TrimSpace(v)
			if v == "" {
				return v, nil
			}
			if _, _, err := parseAddr(v); err != nil {
				return v, err
			}
			*field(c) = v
			return v, nil
		},
	}
}

func addrSetting(path, def, desc string, roles []string, loopback bool, field func(*Config) *string) Definition {
	return Definition{
		Path: path, Default: def, Description: desc, Kind: KindAddress, Roles: roles,
		parse: func(c *Config, _ *loadContext, v string) (string, error) {
			v = strings.TrimSpace(v)
			host, _, err := parseAddr(v)
			if err != nil {
				return v, err
			}
			if loopback && !isLoopback(host) {
				return v, fmt.Errorf("%q is not a loopback address; the management API listens on 127.0.0.1, ::1 or localhost only", v)
			}
			*field(c) = v
			return v, nil
		},
	}
}

// pathParser expands ~/ and requires an absolute path (or "" when
// optional).
func pathParser(field func(*Config) *string, optional bool) func(*Config, *loadContext, string) (string, error) {
	return func(c *Config, ctx *loadContext, v string) (string, error) {
		v = strings.TrimSpace(v)
		if v == "" {
			if optional {
				*field(c) = ""
				return "", nil
			}
			return v, fmt.Errorf("a path is required")
		}
		if v == "~" || strings.HasPrefix(v, "~/") {
			if ctx.home == "" {
				return v, fmt.Errorf("%q: no home directory to expand ~ (set HOME)", v)
			}
			v = filepath.Join(ctx.home, strings.TrimPrefix(v, "~"))
		}
		if !filepath.IsAbs(v) {
			return v, fmt.Errorf("%q is not an absolute path (or ~/...)", v)
		}
		v = filepath.Clean(v)
		*field(c) = v
		return v, nil
	}
}

func intSetting(path string, def, lo, hi int, desc string, roles []string, field func(*Config) *int) Definition {
	return Definition{
		Path: path, Default: strconv.Itoa(def), Description: desc, Kind: KindInt, Roles: roles,
		parse: func(c *Config, _ *loadContext, v string) (string, error) {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				return v, fmt.Errorf("%q is not a whole number", v)
			}
			if n < lo || n > hi {
				return v, fmt.Errorf("%d is outside %d..%d", n, lo, hi)
			}
			*field(c) = n
			return strconv.Itoa(n), nil
		},
	}
}

func boolSetting(path string, def bool, desc string, roles []string, field func(*Config) *bool) Definition {
	return Definition{
		Path: path, Default: strconv.FormatBool(def), Description: desc, Kind: KindBool, Roles: roles,
		parse: func(c *Config, _ *loadContext, v string) (string, error) {
			b, err := strconv.ParseBool(strings.TrimSpace(v))
			if err != nil {
				return v, fmt.Errorf("%q is not true or false", v)
			}
			*field(c) = b
			return strconv.FormatBool(b), nil
		},
	}
}

func sizeSetting(path, def, desc string, roles []string, field func(*Config) *structs.ByteSize) Definition {
	return Definition{
		Path: path, Default: def, Description: desc, Kind: KindSize, Roles: roles,
		parse: func(c *Config, _ *loadContext, v string) (string, error) {
			b, err := structs.ParseByteSize(v)
			if err != nil {
				return v, err
			}
			if b == 0 {
				return v, fmt.Errorf("size %q is zero", v)
			}
			*field(c) = b
			return b.String(), nil
		},
	}
}

// durationSetting: emptyIsZero accepts "" (and "0s") as 0, meaning off or
// none; otherwise the duration must be positive.
func durationSetting(path, def string, emptyIsZero bool, desc string, roles []string, field func(*Config) *structs.Duration) Definition {
	return Definition{
		Path: path, Default: def, Description: desc, Kind: KindDuration, Roles: roles,
		parse: func(c *Config, _ *loadContext, v string) (string, error) {
			if strings.TrimSpace(v) == "" && emptyIsZero {
				*field(c) = 0
				return "", nil
			}
			d, err := parseDuration(v)
			if err != nil {
				return v, err
			}
			if d == 0 && !emptyIsZero {
				return v, fmt.Errorf("must be longer than 0s")
			}
			*field(c) = d
			if d == 0 {
				return "", nil
			}
			return d.String(), nil
		},
	}
}

func amountSetting(path, desc string, field func(*Config) *Amount) Definition {
	return Definition{
		Path: path, Default: "auto", Description: desc, Kind: KindAmount, Roles: engineSide,
		parse: func(c *Config, _ *loadContext, v string) (string, error) {
			a, err := ParseAmount(v)
			if err != nil {
				return v, err
			}
			*field(c) = a
			return a.String(), nil
		},
	}
}
