// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capyctl/capyctl/cmd/capyctl/command"
	"github.com/capyctl/capyctl/cmd/capyctl/internal/e2e"
	"github.com/capyctl/capyctl/core/api/client"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/config"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// run runs capyctl without a role; env adds variables.
func run(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	bin, _ := harness.Binaries(t)
	return harness.RunCLI(t, bin, args, env)
}

// want checks an exit code and that out contains every piece.
func want(t *testing.T, what string, code, wantCode int, out string, pieces ...string) {
	t.Helper()
	if code != wantCode {
		t.Fatalf("%s: exit %d, want %d\n%s", what, code, wantCode, out)
	}
	for _, p := range pieces {
		if !strings.Contains(out, p) {
			t.Fatalf("%s: %q not in output:\n%s", what, p, out)
		}
	}
}

// oneLineJSON decodes JSON printed to a pipe: exactly one line.
func oneLineJSON(t *testing.T, what, out string, v any) {
	t.Helper()
	if strings.Count(out, "\n") != 1 || !strings.HasSuffix(out, "\n") {
		t.Fatalf("%s: JSON to a pipe is not one line:\n%s", what, out)
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("%s: %v\n%s", what, err, out)
	}
}

// errorJSON decodes the --json error object on stderr.
func errorJSON(t *testing.T, what, errOut string) string {
	t.Helper()
	var e struct {
		Error struct {
			Code      string `json:"code"`
			Message   string `json:"message"`
			Retryable bool   `json:"retryable"`
		} `json:"error"`
	}
	oneLineJSON(t, what, errOut, &e)
	if e.Error.Message == "" {
		t.Fatalf("%s: error without a message: %s", what, errOut)
	}
	return e.Error.Code
}

func TestCLI_Offline(t *testing.T) {
	t.Run("version", func(t *testing.T) {
		out, _, code := run(t, nil, "version")
		want(t, "version", code, 0, out, "capyctl ", "commit ")
		out, _, code = run(t, nil, "version", "--json")
		var v map[string]string
		oneLineJSON(t, "version --json", out, &v)
		if code != 0 || v["version"] == "" || v["commit"] == "" {
			t.Fatalf("version json %v", v)
		}
		out, _, code = run(t, nil, "--version")
		want(t, "--version", code, 0, out, "capyctl "+v["version"]+"\n")
	})

	t.Run("help and exit codes", func(t *testing.T) {
		out, _, code := run(t, nil, "--help")
		want(t, "--help", code, 0, out, "deploy", "status deployment", "config show", "help exit-codes",
			"create join-token", "status host", "drain host", "remove host")
		if strings.Contains(out, "\n    driver ") {
			t.Fatalf("the hidden driver command is listed:\n%s", out)
		}
		out, _, code = run(t, nil, "help")
		want(t, "help", code, 0, out, "init standalone")
		out, _, code = run(t, nil, "help", "exit-codes")
		want(t, "help exit-codes", code, 0, out, "Exit 2:", "Exit 25:", "still_stopping", "Exit 26:", "toolchain_missing")
		out, _, code = run(t, nil, "help", "exit-codes", "--json")
		var rows []command.ExitCodeRow
		oneLineJSON(t, "help exit-codes --json", out, &rows)
		seen := map[structs.Code]int{}
		for _, r := range rows {
			for _, c := range r.Codes {
				seen[c.Code] = r.Exit
			}
		}
		for _, info := range structs.Catalogue() {
			if info.Code != structs.CodeOK && seen[info.Code] != info.Exit {
				t.Errorf("%s: exit %d in the table, %d in the catalogue", info.Code, seen[info.Code], info.Exit)
			}
		}
		_, errOut, code := run(t, nil, "nope")
		want(t, "unknown command", code, 2, errOut, "error [invalid_request]", "nope")
		_, errOut, code = run(t, nil, "start")
		want(t, "start alone", code, 2, errOut, "standalone", "needs a subcommand")
	})

	t.Run("init", func(t *testing.T) {
		dir := t.TempDir()
		for _, role := range config.Roles {
			out, _, code := run(t, nil, "init", role)
			want(t, "init "+role, code, 0, out, `role = "`+role+`"`, "# (env CAPYCTL_LISTEN)")
			path := filepath.Join(dir, role+".hcl")
			out, _, code = run(t, nil, "init", role, "--output", path)
			want(t, "init --output", code, 0, out, "Wrote the "+role+" configuration to "+path, "capyctl start "+role+" --config "+path)
			if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
				t.Fatalf("%s: %v %v", path, st, err)
			}
			if c, err := config.Load(config.LoadOptions{File: path, Env: []string{"HOME=/h"}}); err != nil || c.Role != role {
				t.Fatalf("the written %s configuration does not load: %v", role, err)
			}
			_, errOut, code := run(t, nil, "init", role, "--output", path)
			want(t, "init over a file", code, 2, errOut, "error [conflict]", "--force")
			out, _, code = run(t, nil, "init", role, "--output", path, "--force", "--json")
			var res map[string]string
			oneLineJSON(t, "init --json", out, &res)
			if code != 0 || res["role"] != role || res["path"] != path {
				t.Fatalf("init --json: %v", res)
			}
		}
	})

	t.Run("start host refuses without a server or a way to join", func(t *testing.T) {
		_, errOut, code := run(t, nil, "start", "host", "--state-dir", t.TempDir())
		want(t, "start host without --server", code, 2, errOut, "invalid_config", "server_address")
		_, errOut, code = run(t, nil, "start", "host", "--json", "--state-dir", t.TempDir())
		if c := errorJSON(t, "start host --json", errOut); c != "invalid_config" || code != 2 {
			t.Fatalf("start host --json: %s exit %d", c, code)
		}
		_, errOut, code = run(t, nil, "start", "host", "--state-dir", t.TempDir(), "--server", "127.0.0.1:9",
			"--listen", "127.0.0.1:0", "--management-listen", "127.0.0.1:0", "--gpu-provider", "simulated")
		want(t, "start host with no token and no certificate", code, 3, errOut, "join_token_invalid", "--join-token")
		_, errOut, code = run(t, nil, "start", "host", "--state-dir", t.TempDir(), "--server", "127.0.0.1:9", "--join-token", "nonsense",
			"--listen", "127.0.0.1:0", "--management-listen", "127.0.0.1:0", "--gpu-provider", "simulated")
		want(t, "start host with a malformed token", code, 3, errOut, "join_token_invalid")
		for _, role := range []string{"server", "host"} {
			_, errOut, code = run(t, []string{"CAPYCTL_LOG_LEVEL=loud"}, "start", role)
			want(t, "start "+role+" with a bad setting", code, 2, errOut, "invalid_config", "CAPYCTL_LOG_LEVEL")
		}
	})

	t.Run("config show precedence", func(t *testing.T) {
		dir := t.TempDir()
		file := filepath.Join(dir, "role.hcl")
		if err := os.WriteFile(file, []byte("listen = \"127.0.0.1:1111\"\nlog_level = \"debug\"\nmodels_root = \"/m/file\"\nengine_logs = \"memory\"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		env := []string{"CAPYCTL_CONFIG=" + file, "CAPYCTL_LISTEN=127.0.0.1:2222", "CAPYCTL_MODELS_ROOT=/m/env"}
		args := []string{"config", "show", "--listen", "127.0.0.1:3333", "--set", "engine_logs=file", "--state-dir", dir}
		out, _, code := run(t, env, append(args, "--json")...)
		var rc wire.RoleConfig
		oneLineJSON(t, "config show --json", out, &rc)
		if code != 0 || rc.Role != "standalone" || rc.File != file {
			t.Fatalf("config show: exit %d %+v", code, rc)
		}
		got := map[string]wire.ConfigSetting{}
		for _, s := range rc.Settings {
			got[s.Path] = s
		}
		cases := []struct{ path, value, from, detail string }{
			{"listen", "127.0.0.1:3333", "flag", "flag listen"},           // flag over env over file
			{"engine_logs", "file", "flag", "flag engine_logs"},           // --set over file
			{"models_root", "/m/env", "env", "env CAPYCTL_MODELS_ROOT"},   // env over file
			{"log_level", "debug", "file", file + ":2"},                   // file over default
			{"engine_ports", "8100-8199", "default", ""},                  // default
			{"state_dir", dir, "flag", "flag state_dir"},                  // the global --state-dir
			{"management_listen", "127.0.0.1:7443", "default", ""},        // default
			{"request_ledger.retention", "168h", "default", ""},           // nested default
			{"hostname", got["hostname"].Value, "default", "os.Hostname"}, // derived default
			{"plugin_dir", filepath.Join(dir, "plugins"), "default", "<state_dir>/plugins"},
		}
		for _, c := range cases {
			s := got[c.path]
			if s.Value != c.value || s.From != c.from || s.Detail != c.detail || s.Env != config.EnvName(c.path) {
				t.Errorf("%s = %+v, want %s from %s (%s)", c.path, s, c.value, c.from, c.detail)
			}
		}
		out, _, code = run(t, env, args...)
		want(t, "config show", code, 0, out, "Role:   standalone", "Config: "+file, "SETTING", "SOURCE")
		for _, line := range []string{"listen", "models_root", "log_level", "engine_ports"} {
			found := false
			for _, l := range strings.Split(out, "\n") {
				f := strings.Fields(l)
				if len(f) >= 3 && f[0] == line {
					found = true
					src := strings.Join(f[2:], " ")
					if src != source(got[line]) {
						t.Errorf("%s: source %q, want %q", line, src, source(got[line]))
					}
				}
			}
			if !found {
				t.Errorf("no %s row in:\n%s", line, out)
			}
		}
		_, errOut, code := run(t, append(env, "CAPYCTL_LOG_LEVEL=loud"), args...)
		want(t, "a bad env value", code, 2, errOut, "invalid_config", "log_level", "env CAPYCTL_LOG_LEVEL")
		_, errOut, code = run(t, nil, "config", "show", "--config", filepath.Join(dir, "missing.hcl"))
		want(t, "a missing file", code, 2, errOut, "invalid_config", "missing.hcl")
		_, errOut, code = run(t, nil, "config", "show", "--set", "no_such=1")
		want(t, "an unknown setting", code, 2, errOut, "invalid_config", "no_such")
		_, errOut, code = run(t, nil, "config", "show", "--running", "--state-dir", dir)
		want(t, "config show --running without a role", code, 22, errOut, "role_not_running")
	})

	t.Run("validate config", func(t *testing.T) {
		dir := t.TempDir()
		f := filepath.Join(dir, "spec.hcl")
		spec := "deployment \"demo\" {\n  engine = \"fake\"\n  request_deadline = \"90s\"\n  model {\n    path = \"demo\"\n  }\n  engine_config {\n    env = { HF_TOKEN = \"hf_secretsecretsecret\" }\n  }\n}\n"
		if err := os.WriteFile(f, []byte(spec), 0o600); err != nil {
			t.Fatal(err)
		}
		out, _, code := run(t, nil, "validate", "config", "--file", f)
		want(t, "validate config", code, 0, out, `deployment "demo": valid`, "FIELD", "VALUE", "SOURCE", "<redacted>")
		for _, row := range [][]string{{"request_deadline", "1m30s", "file"}, {"instances", "1", "default"}, {"api", "chat", "default"}} {
			if !containsRow(out, row...) {
				t.Errorf("no row %v in:\n%s", row, out)
			}
		}
		if strings.Contains(out, "hf_secret") {
			t.Fatalf("a secret printed:\n%s", out)
		}
		out, _, code = run(t, nil, "validate", "config", "--file", f, "--json")
		var specs []structs.Deployment
		oneLineJSON(t, "validate config --json", out, &specs)
		if code != 0 || len(specs) != 1 || specs[0].Provenance["request_deadline"] != "file" || specs[0].Provenance["instances"] != "default" {
			t.Fatalf("validate config --json: %+v", specs)
		}
		_, errOut, code := run(t, nil, "validate", "config")
		want(t, "validate config without a file", code, 2, errOut, "invalid_request", "--file")
	})

	t.Run("commands need a running role", func(t *testing.T) {
		dir := t.TempDir()
		for _, args := range [][]string{
			{"status"}, {"list", "deployments"}, {"list", "engines"}, {"list", "hosts"}, {"status", "deployment", "x"},
			{"start", "deployment", "x"}, {"stop", "deployment", "x"}, {"park", "deployment", "x"}, {"delete", "deployment", "x"},
			{"engine", "list"}, {"engine", "remove", "x"}, {"engine", "flags", "hello"},
			{"status", "host", "x"}, {"create", "join-token"}, {"drain", "host", "x"}, {"remove", "host", "x"},
		} {
			_, errOut, code := run(t, nil, append(args, "--state-dir", dir)...)
			want(t, strings.Join(args, " "), code, 22, errOut, "error [role_not_running]", "capyctl start standalone")
			_, errOut, _ = run(t, nil, append(args, "--state-dir", dir, "--json")...)
			if c := errorJSON(t, strings.Join(args, " ")+" --json", errOut); c != "role_not_running" {
				t.Fatalf("%v --json: %s", args, c)
			}
		}
	})
}

// containsRow reports whether a line of a table starts with the cells.
func containsRow(out string, cells ...string) bool {
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) >= len(cells) && strings.Join(f[:len(cells)], "\x00") == strings.Join(cells, "\x00") {
			return true
		}
	}
	return false
}

// rowMatches reports whether the table row whose first cell is first
// contains piece.
func rowMatches(out, first, piece string) bool {
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == first && strings.Contains(l, piece) {
			return true
		}
	}
	return false
}

// source mirrors config show's SOURCE column.
func source(s wire.ConfigSetting) string {
	switch {
	case s.Detail == "":
		return s.From
	case strings.HasPrefix(s.Detail, s.From+" "):
		return s.Detail
	case s.From == "default":
		return "default (" + s.Detail + ")"
	}
	return s.From + " " + s.Detail
}

func TestCLI_RoleWithoutEngine(t *testing.T) {
	r := harness.StartStandalone(t, harness.Options{Args: []string{"--json"}})
	// With --json the banner is one JSON object, and says how to add an
	// engine.
	// (stdout and the JSON log lines on stderr are mixed in r.Output().)
	var banner map[string]any
	for _, l := range strings.Split(r.Output(), "\n") {
		var v map[string]any
		if json.Unmarshal([]byte(l), &v) == nil && v["@level"] == nil {
			banner = v
		}
	}
	if banner["role"] != "standalone" || !strings.Contains(fmt.Sprint(banner["hint"]), "capyctl engine add") || banner["management"] != r.Info.Management {
		t.Fatalf("start standalone --json banner: %v\n%s", banner, r.Output())
	}

	out, _, code := r.CLI("status")
	want(t, "status", code, 0, out, "Role:        standalone", "Engines:     none registered", "capyctl engine add <venv|llama-server>", "No deployments",
		"Requests:    ledger on, 0 records dropped")
	out, _, code = r.CLI("status", "--json")
	var rs struct {
		wire.Snapshot
		Hint string `json:"hint"`
	}
	oneLineJSON(t, "status --json", out, &rs)
	if code != 0 || !strings.Contains(rs.Hint, "capyctl engine add") || rs.Role.Role != "standalone" || rs.Cursor == "" ||
		rs.RequestLedger == nil || !rs.RequestLedger.Enabled || rs.RequestLedger.Dropped != 0 {
		t.Fatalf("status --json: %+v", rs)
	}

	out, _, code = r.CLI("list", "engines")
	want(t, "list engines", code, 0, out, "No engine is registered", "capyctl engine add")
	out, _, code = r.CLI("engine", "list", "--json")
	var el wire.EngineList
	oneLineJSON(t, "engine list --json", out, &el)
	if code != 0 || len(el.Engines) != 0 || !strings.Contains(el.Hint, "engine add") {
		t.Fatalf("engine list --json: %+v", el)
	}

	out, _, code = r.CLI("list", "deployments")
	want(t, "list deployments", code, 0, out, "No deployments")
	out, _, code = r.CLI("list", "deployments", "--json")
	if code != 0 || out != `{"api_version":"1","deployments":[]}`+"\n" {
		t.Fatalf("list deployments --json: %d %q; want an object like every list", code, out)
	}

	out, _, code = r.CLI("list", "hosts")
	want(t, "list hosts", code, 0, out, "NAME", "ROLE", "STATE", "ADDRESS", "CARDS", "CHARGED", "LAST SEEN", "CERT EXPIRES", "standalone", "yes")
	// A standalone role keeps none of a server's figures about its hosts.
	if !containsRow(out, r.Info.Host, "standalone", "yes", "-", "-") {
		t.Fatalf("list hosts: no row for %s with STATE and ADDRESS -:\n%s", r.Info.Host, out)
	}
	out, _, code = r.CLI("list", "hosts", "--json")
	var hosts []wire.Host
	oneLineJSON(t, "list hosts --json", out, &hosts)
	if code != 0 || len(hosts) != 1 || hosts[0].Role != "standalone" || !hosts[0].Online {
		t.Fatalf("list hosts --json: %+v", hosts)
	}

	// The fleet's commands: a standalone role answers for itself and has
	// no joined host, no join token to make.
	out, _, code = r.CLI("status", "host", r.Info.Host)
	want(t, "status host", code, 0, out, "Name:          "+r.Info.Host+"\n", "Role:          standalone\n", "State:         -\n")
	out, _, code = r.CLI("status", "host", r.Info.Host, "--json")
	var hd wire.HostDetail
	oneLineJSON(t, "status host --json", out, &hd)
	if code != 0 || hd.Name != r.Info.Host || hd.Role != "standalone" || hd.Instances == nil {
		t.Fatalf("status host --json: %+v", hd)
	}
	_, errOut, code := r.CLI("status", "host", "no-such-host")
	want(t, "status host no-such-host", code, 2, errOut, "error [not_found]")
	for _, args := range [][]string{
		{"create", "join-token"}, {"create", "join-token", "--ttl", "15m", "--host", r.Info.Host},
		{"drain", "host", r.Info.Host}, {"drain", "host", r.Info.Host, "--resume"}, {"remove", "host", r.Info.Host},
	} {
		out, errOut, code := r.CLI(args...)
		want(t, strings.Join(args, " "), code, 5, errOut, "error [unsupported]", "capyctl start server")
		if out != "" {
			t.Fatalf("%v printed %q", args, out)
		}
		_, errOut, _ = r.CLI(append(args, "--json")...)
		if c := errorJSON(t, strings.Join(args, " ")+" --json", errOut); c != "unsupported" {
			t.Fatalf("%v --json: %s", args, c)
		}
	}
	out, _, code = r.CLI("list", "hosts", "--json")
	if code != 0 || !strings.Contains(out, `"name":"`+r.Info.Host+`"`) {
		t.Fatalf("the host is gone after remove host was refused: %s", out)
	}

	out, _, code = r.CLI("config", "show", "--running")
	want(t, "config show --running", code, 0, out, "Role:   standalone", "listen")
	if !rowMatches(out, "engine_ports", "flag engine_ports") {
		t.Fatalf("config show --running: no engine_ports from a flag:\n%s", out)
	}
	out, _, code = r.CLI("config", "show", "--running", "--json")
	var rc wire.RoleConfig
	oneLineJSON(t, "config show --running --json", out, &rc)
	if code != 0 || rc.Role != "standalone" || len(rc.Settings) != len(config.Definitions()) {
		t.Fatalf("config show --running --json: %+v", rc)
	}

	out, _, code = r.CLI("engine", "flags", "custom")
	want(t, "engine flags", code, 0, out, "NAME", "CLASS", "REASON")
	out, _, code = r.CLI("engine", "flags", "custom", "--format", "json")
	var ft wire.FlagTable
	oneLineJSON(t, "engine flags --format json", out, &ft)
	if code != 0 || ft.Family != "custom" {
		t.Fatalf("engine flags json: %+v", ft)
	}
	// Without a running role, a built-in family answers from the driver
	// compiled into capyctl: the same table the role's driver gives.
	noRole := t.TempDir()
	for _, family := range []string{"custom", "llamacpp", "sglang", "tensorfold", "vllm"} {
		viaRole, _, code := r.CLI("engine", "flags", family, "--format", "json")
		if code != 0 {
			t.Fatalf("engine flags %s through the role: exit %d", family, code)
		}
		offline, errOut, code := run(t, nil, "engine", "flags", family, "--format", "json", "--state-dir", noRole)
		if code != 0 || offline != viaRole {
			t.Fatalf("engine flags %s without a role: exit %d %s\n got %s\nwant %s", family, code, errOut, offline, viaRole)
		}
	}
	out, _, code = run(t, nil, "engine", "flags", "vllm", "--state-dir", noRole)
	want(t, "engine flags without a role", code, 0, out, "NAME", "CLASS", "REASON")

	_, errOut, code = r.CLI("status", "deployment", "nope")
	want(t, "status of a missing deployment", code, 2, errOut, "error [not_found]", "nope")
	_, errOut, code = r.CLI("status", "deployment", "nope", "--json")
	if c := errorJSON(t, "status --json of a missing deployment", errOut); c != "not_found" || code != 2 {
		t.Fatalf("status --json: %s %d", c, code)
	}
	_, errOut, code = r.CLI("engine", "remove", "nope")
	want(t, "engine remove of a missing engine", code, 16, errOut, "engine_not_found")

	// A container restarted without --hostname: the state names another
	// host, and the role refuses with both names and the fix.
	r.Stop()
	stored, _ := os.Hostname()
	_, errOut, code = harness.RunCLI(t, r.Bin, []string{"start", "standalone", "--state-dir", r.StateDir, "--hostname", "other-host",
		"--listen", "127.0.0.1:0", "--management-listen", "127.0.0.1:0"}, nil)
	want(t, "start with another hostname", code, 2, errOut, "error [host_name_changed]", `"`+stored+`"`, `"other-host"`, "--hostname "+stored)
}

func TestCLI_DeploymentLifecycle(t *testing.T) {
	r := harness.StartStandalone(t, harness.Options{})
	if out := r.Output(); !strings.Contains(out, "none registered; add one with capyctl engine add") {
		t.Fatalf("the banner does not say how to add an engine:\n%s", out)
	}
	r.AddFakeEngine("fake")

	// engine add/list/remove, text and JSON.
	m := r.WriteFile("manifests/spare.hcl", harness.FakeManifest())
	out, errOut, code := r.CLI("engine", "add", "--custom", r.FakeBin, "--name", "spare", "--manifest", m, "--yes", "--json")
	var det wire.EngineDetected
	oneLineJSON(t, "engine add --json", out, &det)
	if code != 0 || !det.Registered || det.Engine.Name != "spare" || det.Engine.Family != "custom" {
		t.Fatalf("engine add --json: %d %+v %s", code, det, errOut)
	}
	_, errOut, code = r.CLI("engine", "add", "--custom", r.FakeBin, "--name", "again", "--manifest", m)
	want(t, "engine add without --yes and no terminal", code, 23, errOut, "not_interactive", "--yes")
	out, _, code = r.CLI("engine", "list")
	want(t, "engine list", code, 0, out, "NAME", "FAMILY", "fake", "spare", "custom")
	out, _, code = r.CLI("list", "engines", "--json")
	var el wire.EngineList
	oneLineJSON(t, "list engines --json", out, &el)
	if code != 0 || len(el.Engines) != 2 {
		t.Fatalf("list engines --json: %+v", el)
	}
	out, _, code = r.CLI("engine", "remove", "spare", "--json")
	var removed map[string]string
	oneLineJSON(t, "engine remove --json", out, &removed)
	if code != 0 || removed["removed"] != "spare" {
		t.Fatalf("engine remove --json: %v", removed)
	}

	// deploy converges: create, the same file again is a no-op, a changed
	// one is a new revision; --revision is a compare-and-set.
	out, _, code = r.Deploy("demo", harness.SimpleSpec("demo", "fake"))
	want(t, "deploy", code, 0, out, "Deployment demo created (revision 1, on_demand)")
	out, _, code = r.Deploy("demo", harness.SimpleSpec("demo", "fake"))
	want(t, "deploy again", code, 0, out, "Deployment demo unchanged (revision 1, on_demand)")
	changed := strings.Replace(harness.SimpleSpec("demo", "fake"), "  model {", "  request_deadline = \"90s\"\n  model {", 1)
	out, _, code = r.Deploy("demo", changed, "--revision", "1", "--json")
	var accs []wire.DeployAccepted
	oneLineJSON(t, "deploy --json", out, &accs)
	if code != 0 || len(accs) != 1 || accs[0].Revision != 2 || accs[0].Created || accs[0].Unchanged {
		t.Fatalf("deploy --revision --json: %+v", accs)
	}
	_, errOut, code = r.Deploy("demo", harness.SimpleSpec("demo", "fake"), "--revision", "1")
	want(t, "deploy an old revision", code, 2, errOut, "error [revision_conflict]", "revision 2")

	// start --wait, text and JSON; status, text and JSON.
	out, _, code = r.CLI("start", "deployment", "demo", "--wait")
	want(t, "start --wait", code, 0, out, "Deployment demo is ready (1/1 instances)")
	out, _, code = r.CLI("status", "deployment", "demo")
	want(t, "status deployment", code, 0, out, "Name:      demo", "State:     ready (1/1 ready)", "Revision:  2", "INSTANCE", "demo/0")
	st := e2e.Status(t, r, "demo")
	if st.State != "ready" || st.Revision != 2 || len(st.Instances) != 1 {
		t.Fatalf("status --json %+v", st)
	}

	// A chat request's prompt never reaches the role's log.
	const prompt = "the-secret-prompt-do-not-log-7f3a"
	resp, err := r.Chat(context.Background(), harness.ChatBody("demo", false, prompt), nil)
	if err != nil {
		t.Fatal(err)
	}
	answer := harness.ReadAll(resp)
	if resp.StatusCode != 200 {
		t.Fatalf("chat %d %s", resp.StatusCode, answer)
	}
	var completion struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(answer), &completion); err != nil || len(completion.Choices) == 0 || completion.Choices[0].Message.Content == "" {
		t.Fatalf("chat answer %s: %v", answer, err)
	}
	answerText := completion.Choices[0].Message.Content

	// status --watch follows the changes until the deployment is deleted.
	watch := exec.Command(r.Bin, "status", "deployment", "demo", "--watch", "--state-dir", r.StateDir)
	watch.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	pipe, err := watch.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	watch.Stderr = os.Stderr
	if err := watch.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = watch.Process.Kill() }()
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	waitLine := func(what string) {
		t.Helper()
		deadline := time.After(60 * time.Second)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("watch ended before %q", what)
				}
				if strings.Contains(l, what) {
					return
				}
			case <-deadline:
				t.Fatalf("watch printed no %q", what)
			}
		}
	}
	waitLine("INSTANCE")

	out, _, code = r.CLI("stop", "deployment", "demo", "--wait")
	want(t, "stop --wait", code, 0, out, "Deployment demo stopped")
	waitLine("demo: stopped, 0/1 ready, revision 2")
	out, _, code = r.CLI("start", "deployment", "demo", "--wait", "--evict", "--json")
	var ready wire.DeploymentStatus
	oneLineJSON(t, "start --wait --json", out, &ready)
	if code != 0 || ready.State != "ready" {
		t.Fatalf("start --wait --json: %+v", ready)
	}
	waitLine("demo: ready, 1/1 ready")
	out, _, code = r.CLI("park", "deployment", "demo", "--wait")
	want(t, "park --wait", code, 0, out, "Deployment demo stopped: it runs restart_only")
	out, _, code = r.CLI("start", "deployment", "demo", "--json")
	var acc wire.ActionAccepted
	oneLineJSON(t, "start --json", out, &acc)
	if code != 0 || acc.Action != "start" || acc.Done {
		t.Fatalf("start --json: %+v", acc)
	}
	harness.Eventually(t, 60*time.Second, "demo ready again", func() bool { return e2e.Status(t, r, "demo").State == "ready" })
	out, _, code = r.CLI("park", "deployment", "demo", "--wait", "--json")
	oneLineJSON(t, "park --json", out, &acc)
	if code != 0 || acc.Action != "park" || !acc.Done {
		t.Fatalf("park --json: %+v", acc)
	}

	// One instance at a time.
	out, _, code = r.CLI("start", "instance", "demo/0", "--wait")
	want(t, "start instance", code, 0, out, "Instance demo/0: start done")
	out, _, code = r.CLI("park", "instance", "demo/0", "--wait", "--json")
	oneLineJSON(t, "park instance --json", out, &acc)
	if code != 0 || acc.Instance == nil || *acc.Instance != 0 || acc.Action != "park" {
		t.Fatalf("park instance --json: %+v", acc)
	}
	out, _, code = r.CLI("stop", "instance", "demo/0")
	want(t, "stop instance", code, 0, out, "Instance demo/0: stop accepted")
	_, errOut, code = r.CLI("stop", "instance", "demo/9")
	want(t, "stop a missing instance", code, 2, errOut, "error [not_found]")
	_, errOut, code = r.CLI("stop", "instance", "demo")
	want(t, "stop instance without an index", code, 2, errOut, "error [invalid_request]", "<deployment>/<index>")
	out, _, code = r.CLI("stop", "deployment", "demo", "--wait", "--json")
	oneLineJSON(t, "stop --json", out, &acc)
	if code != 0 || !acc.Done {
		t.Fatalf("stop --json: %+v", acc)
	}

	out, _, code = r.CLI("list", "deployments")
	want(t, "list deployments", code, 0, out, "NAME", "STATE", "demo", "stopped")
	out, _, code = r.CLI("status")
	want(t, "status", code, 0, out, "Engines:     fake (custom testkit)", "DEPLOYMENT", "demo")
	_, errOut, code = r.CLI("engine", "remove", "fake")
	want(t, "engine remove in use", code, 20, errOut, "error [engine_in_use]", "demo")

	out, _, code = r.CLI("delete", "deployment", "demo")
	want(t, "delete deployment", code, 0, out, "Deployment demo deleted")
	waitLine("demo: deleted")
	if err := watch.Wait(); err != nil {
		t.Fatalf("watch exit: %v", err)
	}
	_, errOut, code = r.CLI("delete", "deployment", "demo", "--json")
	if c := errorJSON(t, "delete a deleted deployment --json", errOut); c != "not_found" || code != 2 {
		t.Fatalf("delete again: %s %d", c, code)
	}
	out, _, code = r.Deploy("gone", harness.SimpleSpec("gone", "fake"))
	want(t, "deploy", code, 0, out, "created")
	out, _, code = r.CLI("delete", "deployment", "gone", "--json")
	var deleted map[string]string
	oneLineJSON(t, "delete --json", out, &deleted)
	if code != 0 || deleted["deleted"] != "gone" {
		t.Fatalf("delete --json: %v", deleted)
	}

	// The role logs one JSON object per line when not on a terminal, and
	// never the prompt or the answer.
	logs := r.Output()
	if strings.Contains(logs, prompt) {
		t.Fatalf("the role logged a prompt")
	}
	if strings.Contains(logs, answerText) {
		t.Fatalf("the role logged an answer")
	}
	jsonLines := 0
	for _, l := range strings.Split(logs, "\n") {
		if strings.HasPrefix(l, "{") {
			var v map[string]any
			if err := json.Unmarshal([]byte(l), &v); err != nil {
				t.Fatalf("a log line is not JSON: %q", l)
			}
			if v["@message"] == nil || v["@level"] == nil {
				t.Fatalf("a log line without @message/@level: %q", l)
			}
			jsonLines++
		}
	}
	if jsonLines == 0 {
		t.Fatalf("no JSON log lines:\n%s", logs)
	}
}

// TestCLI_DevJSON: capyctl dev --json prints one JSON object with what the
// text version prints, serves it, and leaves nothing after Ctrl-C.
func TestCLI_DevJSON(t *testing.T) {
	t.Run("standalone", func(t *testing.T) { testDevJSON(t) })
	t.Run("server and two hosts", func(t *testing.T) { testDevJSON(t, "--hosts", "2") })
	t.Run("three servers and two hosts", func(t *testing.T) { testDevJSON(t, "--hosts", "2", "--servers", "3") })
}

// testDevJSON runs capyctl dev --json (with args), asks its endpoint for
// the models, stops it with Ctrl-C and requires nothing left behind.
func testDevJSON(t *testing.T, args ...string) {
	bin, _ := harness.Binaries(t)
	cmd := exec.Command(bin, append([]string{"dev", "--json", "--listen", "127.0.0.1:0"}, args...)...)
	tmp := t.TempDir()
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		harness.KillLeftovers(tmp) // what a failed run left: drivers, engines
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		_ = cmd.Wait()
		t.Fatalf("dev --json printed nothing: %v\n%s", err, stderr.String())
	}
	var info map[string]string
	if err := json.Unmarshal([]byte(line), &info); err != nil || info["endpoint"] == "" || info["api_key"] == "" || info["state_dir"] == "" {
		t.Fatalf("dev --json: %q %v", line, err)
	}
	req, _ := http.NewRequest(http.MethodGet, info["endpoint"]+"/models", nil)
	req.Header.Set("Authorization", "Bearer "+info["api_key"])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if body := harness.ReadAll(resp); resp.StatusCode != 200 || !strings.Contains(body, `"id":"demo"`) {
		t.Fatalf("models: %d %s", resp.StatusCode, body)
	}
	if len(args) > 0 {
		// The demo group starts on its first request, one rank per host.
		if info["group_model"] != "group-demo" {
			t.Fatalf("dev --hosts 2 --json names no demo group: %q", line)
		}
		body := strings.NewReader(`{"model":"group-demo","messages":[{"role":"user","content":"Hello"}]}`)
		req, _ := http.NewRequest(http.MethodPost, info["endpoint"]+"/chat/completions", body)
		req.Header.Set("Authorization", "Bearer "+info["api_key"])
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if out := harness.ReadAll(resp); resp.StatusCode != 200 {
			t.Fatalf("the demo group's first request: %d %s", resp.StatusCode, out)
		}
	}
	if slices.Contains(args, "--servers") {
		// Every server answers with the one API key and admin token, each
		// one's management API sees the three voters, and each one lists
		// demo (the hosts link to every server) and answers a chat for it.
		endpoints := strings.Split(info["server_endpoints"], ",")
		mgmts := strings.Split(info["server_managements"], ",")
		if info["servers"] != "dev-server-1,dev-server-2,dev-server-3" || len(endpoints) != 3 || len(mgmts) != 3 || endpoints[0] != info["endpoint"] {
			t.Fatalf("dev --servers 3 --json: %q", line)
		}
		creds, err := client.ReadCredentials(info["state_dir"])
		if err != nil {
			t.Fatal(err)
		}
		for i, ep := range endpoints {
			var body string
			listed := func() bool {
				req, _ := http.NewRequest(http.MethodGet, ep+"/models", nil)
				req.Header.Set("Authorization", "Bearer "+info["api_key"])
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return false
				}
				body = harness.ReadAll(resp)
				return resp.StatusCode == 200 && strings.Contains(body, `"id":"demo"`)
			}
			poll.Until(t, 20*time.Second, "demo listed on "+ep, listed)
			chat := strings.NewReader(`{"model":"demo","messages":[{"role":"user","content":"Hello"}]}`)
			req, _ := http.NewRequest(http.MethodPost, ep+"/chat/completions", chat)
			req.Header.Set("Authorization", "Bearer "+info["api_key"])
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if out := harness.ReadAll(resp); resp.StatusCode != 200 {
				t.Fatalf("a chat through %s: %d %s", ep, resp.StatusCode, out)
			}
			list, err := client.New(mgmts[i], creds.AdminToken).Servers(context.Background())
			if err != nil || list.Voters != 3 || list.Leader != "dev-server-1" {
				t.Fatalf("list servers on %s: %+v %v", mgmts[i], list, err)
			}
		}
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("dev exit: %v", err)
	}
	if left := harness.Leftovers(info["state_dir"]); len(left) != 0 {
		t.Fatalf("processes left after Ctrl-C: %v", left)
	}
	if _, err := os.Stat(info["state_dir"]); !os.IsNotExist(err) {
		t.Fatalf("the temporary state directory %s is still there: %v", info["state_dir"], err)
	}
	if len(args) > 0 && info["hosts"] != "dev-gpu-1,dev-gpu-2" {
		t.Fatalf("dev --hosts 2: hosts %q", info["hosts"])
	}
}
