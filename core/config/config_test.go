// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/core/structs"
)

// writeFile writes a config file in a temporary directory.
func writeFile(t *testing.T, name, src string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLoad_Precedence(t *testing.T) {
	file := writeFile(t, "role.hcl", `
listen = "127.0.0.1:8001"
log_level = "debug"
gpu {
  provider = "simulated"
  sim_devices = 2
}
memory {
  system {
    managed_limit = "75%"
  }
}
`)
	env := []string{
		"HOME=/home/op",
		"CAPYCTL_LISTEN=127.0.0.1:8002",
		"CAPYCTL_GPU_SIM_DEVICES=3",
		"CAPYCTL_MEMORY_SYSTEM_FREE_RESERVE=10GiB",
		"CAPYCTL_LOG_FORMAT=", // empty: unset
		"CAPYCTL_UNRELATED=1", // not a setting: ignored
	}
	flags := map[string]string{"listen": "127.0.0.1:8003", "engine_ports": "9000-9099"}
	c, err := Load(LoadOptions{File: file, Env: env, Flags: flags})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		path   string
		value  string
		from   string
		detail string
	}{
		{name: "flag beats env and file", path: "listen", value: "127.0.0.1:8003", from: FromFlag, detail: "flag listen"},
		{name: "flag alone", path: "engine_ports", value: "9000-9099", from: FromFlag, detail: "flag engine_ports"},
		{name: "env beats file", path: "gpu.sim_devices", value: "3", from: FromEnv, detail: "env CAPYCTL_GPU_SIM_DEVICES"},
		{name: "env alone", path: "memory.system.free_reserve", value: "10GiB", from: FromEnv, detail: "env CAPYCTL_MEMORY_SYSTEM_FREE_RESERVE"},
		{name: "file", path: "log_level", value: "debug", from: FromFile, detail: file + ":3"},
		{name: "file in a block", path: "gpu.provider", value: "simulated", from: FromFile, detail: file + ":5"},
		{name: "file in a nested block", path: "memory.system.managed_limit", value: "75%", from: FromFile, detail: file + ":10"},
		{name: "empty env is unset", path: "log_format", value: "auto", from: FromDefault},
		{name: "default", path: "management_listen", value: "127.0.0.1:7443", from: FromDefault},
		{name: "derived default", path: "state_dir", value: "/home/op/.local/state/capyctl", from: FromDefault, detail: "~/.local/state/capyctl"},
		{name: "derived from a derived default", path: "plugin_dir", value: "/home/op/.local/state/capyctl/plugins", from: FromDefault, detail: "<state_dir>/plugins"},
		{name: "models root expanded", path: "models_root", value: "/home/op/models", from: FromDefault},
	}
	prov := c.Provenance()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := prov[tc.path]
			if got.Value != tc.value || got.From != tc.from || (tc.detail != "" && got.Detail != tc.detail) {
				t.Errorf("provenance[%s] = %+v, want value %q from %q (%q)", tc.path, got, tc.value, tc.from, tc.detail)
			}
		})
	}
	if c.Listen != "127.0.0.1:8003" || c.GPU.SimDevices != 3 || c.GPU.Provider != "simulated" ||
		c.Memory.System.ManagedLimit.Percent != 75 || c.Memory.System.FreeReserve.Bytes != structs.ByteSize(10*structs.GiB) ||
		c.EnginePorts != (PortRange{9000, 9099}) || c.LogLevel != "debug" {
		t.Errorf("typed config = %+v", c)
	}
}

func TestLoad_Defaults(t *testing.T) {
	cases := []struct {
		name      string
		env       []string
		flags     map[string]string
		stateDir  string
		pluginDir string
	}{
		{name: "home", env: []string{"HOME=/h"}, stateDir: "/h/.local/state/capyctl", pluginDir: "/h/.local/state/capyctl/plugins"},
		{name: "xdg", env: []string{"HOME=/h", "XDG_STATE_HOME=/x/state"}, stateDir: "/x/state/capyctl", pluginDir: "/x/state/capyctl/plugins"},
		{name: "plugin dir follows a state dir flag", env: []string{"HOME=/h"}, flags: map[string]string{"state_dir": "/srv/capy"},
			stateDir: "/srv/capy", pluginDir: "/srv/capy/plugins"},
		{name: "tilde in a flag", env: []string{"HOME=/h"}, flags: map[string]string{"state_dir": "~/st"}, stateDir: "/h/st", pluginDir: "/h/st/plugins"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(LoadOptions{Env: tc.env, Flags: tc.flags})
			if err != nil {
				t.Fatal(err)
			}
			if c.StateDir != tc.stateDir || c.PluginDir != tc.pluginDir {
				t.Errorf("state_dir, plugin_dir = %q, %q; want %q, %q", c.StateDir, c.PluginDir, tc.stateDir, tc.pluginDir)
			}
		})
	}
	c, err := Load(LoadOptions{Env: []string{"HOME=/h"}})
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	want := Config{
		Role: "standalone", Listen: "0.0.0.0:8443", ManagementListen: "127.0.0.1:7443", ModelsRoot: "/h/models",
		EnginePorts: PortRange{8100, 8199}, Hostname: host, LogLevel: "info", LogFormat: "auto", EngineTelemetry: "off",
		EngineLogs: "file", Retention: "standard",
	}
	if c.Role != want.Role || c.Listen != want.Listen || c.ManagementListen != want.ManagementListen ||
		c.ModelsRoot != want.ModelsRoot || c.EnginePorts != want.EnginePorts || c.Hostname != want.Hostname ||
		c.LogLevel != want.LogLevel || c.LogFormat != want.LogFormat || c.EngineTelemetry != want.EngineTelemetry ||
		c.EngineLogs != want.EngineLogs || c.Retention != want.Retention {
		t.Errorf("defaults = %+v", c)
	}
	if c.GPU != (GPUConfig{Provider: "auto", SimDevices: 1, SimDeviceMemory: structs.ByteSize(24 * structs.GiB)}) {
		t.Errorf("gpu = %+v", c.GPU)
	}
	if !c.Memory.System.ManagedLimit.Auto || !c.Memory.GPU.FreeReserve.Auto {
		t.Errorf("memory = %+v", c.Memory)
	}
	if c.Limits.MaxWaitingTotal != 256 || c.Limits.MaxWaitingBytes != structs.ByteSize(64*structs.MiB) ||
		c.Limits.RequestDeadline.String() != "10m" || c.Limits.MaxBodyBytes != structs.ByteSize(64*structs.MiB) {
		t.Errorf("limits = %+v", c.Limits)
	}
	if c.Shutdown.DrainTimeout.String() != "30s" || c.LifecycleDefaults != (LifecycleDefaults{}) {
		t.Errorf("shutdown, lifecycle = %+v, %+v", c.Shutdown, c.LifecycleDefaults)
	}
	if c.Limits.MaxBodyBytesInFlight != structs.ByteSize(256*structs.MiB) {
		t.Errorf("limits.max_body_bytes_in_flight = %s", c.Limits.MaxBodyBytesInFlight)
	}
	if l := c.Listener; l.ReadHeaderTimeout.String() != "10s" || l.IdleTimeout.String() != "1m" || l.BodyReadTimeout.String() != "1m" ||
		l.MaxConnections != 4096 || l.MaxUnauthenticatedPerAddress != 512 {
		t.Errorf("listener = %+v", l)
	}
	if c.TLS != (TLS{}) {
		t.Errorf("tls = %+v, want plain HTTP by default", c.TLS)
	}
	if !c.RequestLedger.Enabled || c.RequestLedger.Retention.String() != "168h" || c.RequestLedger.MaxRecords != 100000 {
		t.Errorf("request ledger = %+v", c.RequestLedger)
	}
	if got := c.Provenance()["hostname"]; got.From != FromDefault || got.Detail != "os.Hostname" {
		t.Errorf("hostname provenance = %+v", got)
	}
}

func TestConfig_Settings(t *testing.T) {
	c, err := Load(LoadOptions{Env: []string{"HOME=/h", "CAPYCTL_LOG_LEVEL=warn"}})
	if err != nil {
		t.Fatal(err)
	}
	settings := c.Settings()
	if len(settings) != len(Definitions()) {
		t.Fatalf("%d settings, want %d", len(settings), len(Definitions()))
	}
	for i := 1; i < len(settings); i++ {
		if settings[i-1].Path >= settings[i].Path {
			t.Errorf("settings not sorted: %s before %s", settings[i-1].Path, settings[i].Path)
		}
	}
	for _, s := range settings {
		if s.From == "" || s.Env == "" || s.Description == "" {
			t.Errorf("incomplete setting %+v", s)
		}
		if s.Path == "log_level" && (s.Value != "warn" || s.From != FromEnv || s.Default != "info") {
			t.Errorf("log_level = %+v", s)
		}
		if s.Path == "state_dir" && s.Default != "$XDG_STATE_HOME/capyctl, else ~/.local/state/capyctl" {
			t.Errorf("state_dir default text = %q", s.Default)
		}
	}
}

func TestDefinitions(t *testing.T) {
	seenEnv := map[string]bool{}
	for _, d := range Definitions() {
		if d.Env != EnvName(d.Path) || seenEnv[d.Env] {
			t.Errorf("%s: env %q", d.Path, d.Env)
		}
		seenEnv[d.Env] = true
		if d.Description == "" || d.Kind == "" || len(d.Roles) == 0 {
			t.Errorf("%s: incomplete definition %+v", d.Path, d)
		}
		if d.Default == "" && d.defaultText == "" && d.computed == nil && d.Kind != KindDuration && d.Kind != KindPath {
			t.Errorf("%s: no default", d.Path)
		}
	}
	if got := EnvName("memory.system.managed_limit"); got != "CAPYCTL_MEMORY_SYSTEM_MANAGED_LIMIT" {
		t.Errorf("EnvName = %q", got)
	}
}

func TestLoad_RetentionZero(t *testing.T) {
	c, err := Load(LoadOptions{Env: []string{"HOME=/h"}, Flags: map[string]string{"retention": "zero"}})
	if err != nil {
		t.Fatal(err)
	}
	if c.EngineLogs != "memory" {
		t.Errorf("engine_logs = %q under zero retention, want memory", c.EngineLogs)
	}
	if got := c.Provenance()["engine_logs"]; got.Value != "memory" || !strings.Contains(got.Detail, "retention = zero") {
		t.Errorf("engine_logs provenance = %+v", got)
	}
	// Stored responses hold prompts and answers: none are kept.
	if c.Responses.Retention != 0 || !strings.Contains(c.Provenance()["responses.retention"].Detail, "retention = zero") {
		t.Errorf("responses.retention = %v (%+v) under zero retention, want 0", c.Responses.Retention, c.Provenance()["responses.retention"])
	}
}

// wantInvalid checks an invalid_config error naming the setting and the
// source.
func wantInvalid(t *testing.T, err error, setting, from, contains string) {
	t.Helper()
	if err == nil {
		t.Fatal("want an error")
	}
	e := structs.AsError(err)
	if e.Code != structs.CodeInvalidConfig || e.Info().Exit != 2 {
		t.Fatalf("code = %q (exit %d), want invalid_config (exit 2): %v", e.Code, e.Info().Exit, err)
	}
	if setting != "" && e.Details["setting"] != setting {
		t.Errorf("details.setting = %v, want %s (%v)", e.Details["setting"], setting, err)
	}
	if e.Details["source"] != from {
		t.Errorf("details.source = %v, want %s (%v)", e.Details["source"], from, err)
	}
	if !strings.Contains(e.Message, contains) {
		t.Errorf("message %q does not contain %q", e.Message, contains)
	}
	if _, ok := e.Details["problems"].([]Problem); !ok {
		t.Errorf("details lack problems: %#v", e.Details)
	}
}

func TestLoad_Invalid(t *testing.T) {
	cases := []struct {
		name     string
		file     string
		env      []string
		flags    map[string]string
		setting  string
		from     string
		contains string
	}{
		{name: "unknown key", file: "listen = \"127.0.0.1:1\"\ncolour = \"red\"\n", from: FromFile, contains: "role.hcl:2:1: Unsupported argument"},
		{name: "unknown key in a block", file: "gpu {\n  vendor = \"x\"\n}\n", from: FromFile, contains: "role.hcl:2:3: Unsupported argument"},
		{name: "unknown block", file: "security {\n}\n", from: FromFile, contains: "role.hcl:1:1: Unsupported block type"},
		{name: "attribute where a block goes", file: "gpu = \"nvml\"\n", from: FromFile, contains: "role.hcl:1:1"},
		{name: "duplicate block", file: "gpu {\n}\ngpu {\n}\n", from: FromFile, contains: "role.hcl:3:1: duplicate gpu block"},
		{name: "syntax error", file: "listen = \n", from: FromFile, contains: "role.hcl:"},
		{name: "list value", file: "listen = [\"a\"]\n", from: FromFile, contains: "a string, number or bool is required"},
		{name: "bad size in file", file: "gpu {\n  sim_device_memory = \"24 gigs\"\n}\n", setting: "gpu.sim_device_memory", from: FromFile, contains: "/role.hcl:2): size"},
		{name: "bad percentage", file: "memory {\n  system {\n    managed_limit = \"150%\"\n  }\n}\n", setting: "memory.system.managed_limit", from: FromFile, contains: "outside"},
		{name: "bad amount from env", env: []string{"CAPYCTL_MEMORY_GPU_FREE_RESERVE=lots"}, setting: "memory.gpu.free_reserve", from: FromEnv, contains: "env CAPYCTL_MEMORY_GPU_FREE_RESERVE"},
		{name: "non-loopback management from file", file: "management_listen = \"0.0.0.0:7443\"\n", setting: "management_listen", from: FromFile, contains: "not a loopback address"},
		{name: "non-loopback management from env", env: []string{"CAPYCTL_MANAGEMENT_LISTEN=10.0.0.5:7443"}, setting: "management_listen", from: FromEnv, contains: "env CAPYCTL_MANAGEMENT_LISTEN"},
		{name: "non-loopback management from flag", flags: map[string]string{"management_listen": "[::]:7443"}, setting: "management_listen", from: FromFlag, contains: "flag management_listen"},
		{name: "unknown flag", flags: map[string]string{"gpu.vendor": "x"}, setting: "gpu.vendor", from: FromFlag, contains: "unknown setting"},
		{name: "bad enum", flags: map[string]string{"log_format": "xml"}, setting: "log_format", from: FromFlag, contains: "not one of auto, text, json"},
		{name: "bad role", file: "role = \"client\"\n", setting: "role", from: FromFile, contains: "not one of standalone"},
		{name: "bad int", env: []string{"CAPYCTL_GPU_SIM_DEVICES=two"}, setting: "gpu.sim_devices", from: FromEnv, contains: "not a whole number"},
		{name: "int out of range", flags: map[string]string{"gpu.sim_devices": "0"}, setting: "gpu.sim_devices", from: FromFlag, contains: "outside 1..16"},
		{name: "bad bool", flags: map[string]string{"gpu.sim_unified": "maybe"}, setting: "gpu.sim_unified", from: FromFlag, contains: "true or false"},
		{name: "bad duration", flags: map[string]string{"shutdown.drain_timeout": "soon"}, setting: "shutdown.drain_timeout", from: FromFlag, contains: "does not parse"},
		{name: "zero deadline", flags: map[string]string{"limits.request_deadline": "0s"}, setting: "limits.request_deadline", from: FromFlag, contains: "longer than 0s"},
		{name: "bad address", flags: map[string]string{"listen": "8443"}, setting: "listen", from: FromFlag, contains: "not host:port"},
		{name: "bad port range", flags: map[string]string{"engine_ports": "8199-8100"}, setting: "engine_ports", from: FromFlag, contains: "first <= last"},
		{name: "relative path", flags: map[string]string{"models_root": "models"}, setting: "models_root", from: FromFlag, contains: "not an absolute path"},
		{name: "bad hostname", flags: map[string]string{"hostname": "gpu_a!"}, setting: "hostname", from: FromFlag, contains: "not a hostname"},
		{name: "percentages over 100", file: "memory {\n  gpu {\n    managed_limit = \"90%\"\n    free_reserve = \"20%\"\n  }\n}\n",
			setting: "memory.gpu.free_reserve", from: FromFile, contains: "add up to more than 100%"},
		{name: "body larger than the waiting bytes", flags: map[string]string{"limits.max_body_bytes": "128MiB"}, setting: "limits.max_body_bytes", from: FromFlag, contains: "larger than all waiting bodies"},
		{name: "bodies in flight smaller than a body", flags: map[string]string{"limits.max_body_bytes_in_flight": "32MiB"}, setting: "limits.max_body_bytes_in_flight", from: FromFlag, contains: "cannot hold one"},
		{name: "tls cert without key", file: "tls {\n  cert_file = \"/etc/capyctl/cert.pem\"\n}\n", setting: "tls.key_file", from: FromDefault, contains: "needs both"},
		{name: "tls key without cert", flags: map[string]string{"tls.key_file": "/k.pem"}, setting: "tls.cert_file", from: FromDefault, contains: "needs both"},
		{name: "client CA without tls", flags: map[string]string{"tls.client_ca_file": "/ca.pem"}, setting: "tls.client_ca_file", from: FromFlag, contains: "need TLS"},
		{name: "relative cert path", flags: map[string]string{"tls.cert_file": "cert.pem", "tls.key_file": "/k.pem"}, setting: "tls.cert_file", from: FromFlag, contains: "not an absolute path"},
		{name: "negative connection cap", flags: map[string]string{"listener.max_connections": "-1"}, setting: "listener.max_connections", from: FromFlag, contains: "outside"},
		{name: "zero idle timeout", flags: map[string]string{"listener.idle_timeout": "0s"}, setting: "listener.idle_timeout", from: FromFlag, contains: "longer than 0s"},
		{name: "engine ports hold the listen port", flags: map[string]string{"listen": "0.0.0.0:8150"}, setting: "engine_ports", from: FromDefault, contains: "holds the inference port 8150"},
		{name: "shared address", flags: map[string]string{"listen": "127.0.0.1:7443"}, setting: "management_listen", from: FromDefault, contains: "cannot share"},
		{name: "zero retention with file logs", flags: map[string]string{"retention": "zero", "engine_logs": "file"}, setting: "engine_logs", from: FromFlag, contains: "in memory only"},
		{name: "zero retention with stored responses", flags: map[string]string{"retention": "zero", "responses.retention": "24h"}, setting: "responses.retention", from: FromFlag, contains: "stores no response"},
		{name: "enabled ledger keeping nothing", flags: map[string]string{"request_ledger.max_records": "0"}, setting: "request_ledger.max_records", from: FromFlag, contains: "enabled = false"},
		{name: "sim state without the simulated gpu", flags: map[string]string{"gpu.provider": "nvml", "gpu.sim_state": "/tmp/sim.json"}, setting: "gpu.sim_state", from: FromFlag, contains: "simulated provider only"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			opts := LoadOptions{Env: append([]string{"HOME=/h"}, tc.env...), Flags: tc.flags}
			if tc.file != "" {
				opts.File = writeFile(t, "role.hcl", tc.file)
			}
			_, err := Load(opts)
			wantInvalid(t, err, tc.setting, tc.from, tc.contains)
		})
	}
}

func TestLoad_MissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nope.hcl")
	_, err := Load(LoadOptions{File: path})
	wantInvalid(t, err, "", FromFile, path)
}

func TestLoad_JSONSyntax(t *testing.T) {
	path := writeFile(t, "role.json", `{"listen": "127.0.0.1:9443", "gpu": {"provider": "none"}, "limits": {"max_waiting_total": 10}}`)
	c, err := Load(LoadOptions{File: path, Env: []string{"HOME=/h"}})
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:9443" || c.GPU.Provider != "none" || c.Limits.MaxWaitingTotal != 10 {
		t.Errorf("config = %+v", c)
	}
	if got := c.Provenance()["limits.max_waiting_total"]; got.From != FromFile {
		t.Errorf("provenance = %+v", got)
	}
}

// TestLoad_Bounds: a role configuration nested too deep or too large is
// refused with its position, without crashing this process.
func TestLoad_Bounds(t *testing.T) {
	cases := []struct{ name, file, src, contains string }{
		{"nested list", "role.hcl", "listen = " + strings.Repeat("[", 100000) + "\n", "role.hcl:1:"},
		{"nested blocks", "role.hcl", strings.Repeat("gpu {\n", 100000), "role.hcl:101:5: Configuration nested too deeply"},
		{"nested json", "role.json", `{"gpu": ` + strings.Repeat("{", 100000), "role.json:1:"},
		{"oversize", "role.hcl", strings.Repeat("# padding padding padding\n", 50000), "Configuration too large"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(LoadOptions{File: writeFile(t, tc.file, tc.src), Env: []string{"HOME=/h"}})
			wantInvalid(t, err, "", FromFile, tc.contains)
		})
	}
}

func TestLoad_ServerJoinTakesSeveralAddresses(t *testing.T) {
	c, err := Load(LoadOptions{Env: []string{"HOME=/h"}, Flags: map[string]string{"role": RoleServer, "server_join": " s1.example.com:8444, 10.0.0.2:8444 ,"}})
	if err != nil {
		t.Fatal(err)
	}
	if c.ServerJoin != "s1.example.com:8444,10.0.0.2:8444" {
		t.Fatalf("server_join = %q", c.ServerJoin)
	}
	_, err = Load(LoadOptions{Env: []string{"HOME=/h"}, Flags: map[string]string{"role": RoleServer, "server_join": "s1.example.com:8444,nope"}})
	wantInvalid(t, err, "server_join", "flag", "nope")
}
