// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package main_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/cmd/capyctl/command"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// unit is a parsed systemd unit: section → key → values (in order).
type unit map[string]map[string][]string

func parseUnit(t *testing.T, path string) unit {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := unit{}
	section := ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s:%d: not key=value in a section: %q", path, n, line)
			}
			u[section][k] = append(u[section][k], v)
		}
	}
	return u
}

func (u unit) one(t *testing.T, section, key string) string {
	t.Helper()
	v := u[section][key]
	if len(v) != 1 {
		t.Fatalf("[%s] %s: %d values %q, want one", section, key, len(v), v)
	}
	return v[0]
}

// TestSystemdUnits validates configs/systemd: one unit per role, system
// and user; each runs `capyctl start <role>`, restarts on failure but not
// on the exit codes of a configuration error, and signals only the role's
// own process (KillMode=process) so a restart never stops an engine.
func TestSystemdUnits(t *testing.T) {
	root := filepath.Join("..", "..", "configs", "systemd")
	noRestart := []string{}
	for _, c := range []structs.Code{structs.CodeInvalidConfig, structs.CodeUnauthorized, structs.CodeUnsupported} {
		noRestart = append(noRestart, strconv.Itoa(structs.Lookup(c).Exit))
	}
	commands := command.CommandNames()
	for _, scope := range []string{"system", "user"} {
		for _, role := range []string{"standalone", "server", "host"} {
			path := filepath.Join(root, scope, "capyctl-"+role+".service")
			t.Run(scope+"/"+role, func(t *testing.T) {
				u := parseUnit(t, path)
				exec := strings.Fields(u.one(t, "Service", "ExecStart"))
				if len(exec) < 3 || filepath.Base(exec[0]) != "capyctl" || exec[1] != "start" || exec[2] != role {
					t.Fatalf("ExecStart %q does not run capyctl start %s", exec, role)
				}
				if !slices.Contains(commands, "start "+role) {
					t.Fatalf("capyctl has no start %s command", role)
				}
				if i := slices.Index(exec, "--config"); i < 0 || i+1 >= len(exec) || !strings.HasSuffix(exec[i+1], role+".hcl") {
					t.Fatalf("ExecStart %q names no %s.hcl configuration", exec, role)
				}
				checks := map[string]string{"KillMode": "process", "Restart": "on-failure", "Type": "simple"}
				for k, want := range checks {
					if got := u.one(t, "Service", k); got != want {
						t.Errorf("%s=%s, want %s", k, got, want)
					}
				}
				got := strings.Fields(u.one(t, "Service", "RestartPreventExitStatus"))
				if !slices.Equal(got, noRestart) {
					t.Errorf("RestartPreventExitStatus=%v, want the configuration errors' exit codes %v", got, noRestart)
				}
				// A busy address at boot (the previous role still
				// stopping) is retried: the unit restarts on it.
				for _, c := range []structs.Code{structs.CodeAddressInUse, structs.CodeStoreUnavailable, structs.CodeNotLeader} {
					if info := structs.Lookup(c); !info.Retryable || slices.Contains(got, strconv.Itoa(info.Exit)) {
						t.Errorf("%s (exit %d) is not restarted on, or not retryable", c, info.Exit)
					}
				}
				want := map[string]string{"system": "multi-user.target", "user": "default.target"}[scope]
				if got := u.one(t, "Install", "WantedBy"); got != want {
					t.Errorf("WantedBy=%s, want %s", got, want)
				}
				if scope == "system" {
					var dirs []string
					for _, v := range u["Service"]["StateDirectory"] {
						dirs = append(dirs, strings.Fields(v)...)
					}
					if u.one(t, "Service", "User") != "capyctl" || len(dirs) == 0 || dirs[0] != "capyctl" {
						t.Errorf("a system unit runs as the capyctl user with StateDirectory=capyctl")
					}
					env := map[string]string{}
					for _, e := range u["Service"]["Environment"] {
						k, v, _ := strings.Cut(e, "=")
						env[k] = v
					}
					state := env["CAPYCTL_STATE_DIR"]
					if state != "/var/lib/capyctl" {
						t.Errorf("CAPYCTL_STATE_DIR=%q, want /var/lib/capyctl", state)
					}
					// A role that runs engines keeps its models outside
					// the state directory (the backup page copies the
					// state, not the models), in a directory systemd
					// makes for the capyctl user.
					if role != "server" {
						models := env["CAPYCTL_MODELS_ROOT"]
						if models == "" || models == state || strings.HasPrefix(models, state+"/") {
							t.Errorf("CAPYCTL_MODELS_ROOT=%q: the models must live outside the state directory %s", models, state)
						}
						if !slices.Contains(dirs, strings.TrimPrefix(models, "/var/lib/")) {
							t.Errorf("StateDirectory=%v does not create the models directory %s", dirs, models)
						}
					}
				}
			})
		}
	}

	// systemd's own checker, where it can run: the units parse, with the
	// path of the binary pointed at the one built for the tests.
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Log("systemd-analyze is not installed: skipped systemd's own verification")
		return
	}
	bin, _ := harness.Binaries(t)
	dir := t.TempDir()
	for _, role := range []string{"standalone", "server", "host"} {
		data, err := os.ReadFile(filepath.Join(root, "system", "capyctl-"+role+".service"))
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, "capyctl-"+role+".service")
		if err := os.WriteFile(p, []byte(strings.ReplaceAll(string(data), "/usr/local/bin/capyctl", bin)), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(sa, "verify", p).CombinedOutput()
		if err != nil && strings.Contains(string(out), "Failed to initialize manager") {
			t.Logf("systemd-analyze cannot run here: %s", out)
			return
		}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if line != "" && strings.Contains(line, "capyctl-"+role+".service") {
				t.Errorf("systemd-analyze verify: %s", line)
			}
		}
	}
}
