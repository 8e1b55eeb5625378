// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package cli_test

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/cmd/capyctl/command"
	"github.com/capyctl/capyctl/cmd/capyctl/internal/e2e"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// TestFirstHour_GPUFound: under gpu.provider = auto the banner, the log
// and capyctl status name every GPU found, or say "no GPU found (<why>)"
// on a machine without NVML, as this test machine (CI) is.
func TestFirstHour_GPUFound(t *testing.T) {
	r := harness.StartStandalone(t, harness.Options{Args: []string{"--gpu-provider", "auto"}})
	status, errOut, code := r.CLI("status")
	if code != 0 {
		t.Fatalf("status: exit %d %s", code, errOut)
	}
	jsonOut, _, _ := r.CLI("status", "--json")
	var snap struct {
		Role struct {
			GPU *struct {
				Provider string `json:"provider"`
				Driver   string `json:"driver"`
				Devices  []struct {
					Name       string `json:"name"`
					TotalBytes int64  `json:"total_bytes"`
				} `json:"devices"`
				NoGPU string `json:"no_gpu"`
			} `json:"gpu"`
			ModelsRoot string `json:"models_root"`
		} `json:"role"`
	}
	if err := json.Unmarshal([]byte(jsonOut), &snap); err != nil || snap.Role.GPU == nil {
		t.Fatalf("status --json names no GPU inventory: %v\n%s", err, jsonOut)
	}
	g := snap.Role.GPU
	if snap.Role.ModelsRoot == "" || !strings.Contains(status, "Models:      "+snap.Role.ModelsRoot) {
		t.Fatalf("status does not say where models live (%q):\n%s", snap.Role.ModelsRoot, status)
	}
	banner := r.Output()
	if len(g.Devices) == 0 {
		// No NVML here: all three say so, with NVML's reason.
		// The reason is NVML's own answer (or the build's), not a blank.
		if g.Provider != "none" || !strings.Contains(strings.ToLower(g.NoGPU), "nvml") {
			t.Fatalf("inventory without a GPU names no reason from NVML: %+v", g)
		}
		line := "no GPU found (" + g.NoGPU + ")"
		if !strings.Contains(banner, "GPUs:        "+line) {
			t.Fatalf("the banner does not say %q:\n%s", line, banner)
		}
		if !strings.Contains(status, "GPUs:        "+line) {
			t.Fatalf("status does not say %q:\n%s", line, status)
		}
		reason, _ := json.Marshal(g.NoGPU)
		if !strings.Contains(banner, `"@message":"no GPU found"`) || !strings.Contains(banner, `"reason":`+string(reason)) {
			t.Fatalf("the log does not say no GPU was found, and why:\n%s", banner)
		}
		return
	}
	// A GPU machine: every card with its model, memory and the driver.
	for _, d := range g.Devices {
		want := d.Name + ", " + structs.FormatBytes(d.TotalBytes) + ", driver " + g.Driver
		if g.Driver == "" || !strings.Contains(banner, want) || !strings.Contains(status, want) {
			t.Fatalf("%q not in the banner or status:\n%s\n%s", want, banner, status)
		}
	}
}

// TestFirstHour_AddressInUse: a busy address is its own code
// (address_in_use, exit 29, retryable; the units restart on it), and the
// message names the flag that chooses another one.
func TestFirstHour_AddressInUse(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	addr := busy.Addr().String()
	info := structs.Lookup(structs.CodeAddressInUse)
	if info.Exit != 29 || !info.Retryable {
		t.Fatalf("address_in_use is %+v, want exit 29, retryable", info)
	}
	cases := []struct{ flag, other string }{
		{"--listen", "--management-listen"},
		{"--management-listen", "--listen"},
	}
	for _, c := range cases {
		t.Run(c.flag, func(t *testing.T) {
			dir := t.TempDir()
			_, errOut, code := run(t, nil, "start", "standalone", "--state-dir", dir, "--gpu-provider", "none",
				c.flag, addr, c.other, "127.0.0.1:0", "--json")
			if code != info.Exit {
				t.Fatalf("start on a busy %s: exit %d, want %d\n%s", c.flag, code, info.Exit, errOut)
			}
			// The role logged before it failed: the error is the last line.
			lines := strings.Split(strings.TrimSpace(errOut), "\n")
			if got := errorJSON(t, "busy address", lines[len(lines)-1]+"\n"); got != string(structs.CodeAddressInUse) {
				t.Fatalf("code %s, want address_in_use\n%s", got, errOut)
			}
			if !strings.Contains(errOut, c.flag) || !strings.Contains(errOut, addr) || !strings.Contains(errOut, `"retryable":true`) {
				t.Fatalf("the message does not name %s and %s, or is not retryable:\n%s", c.flag, addr, errOut)
			}
		})
	}
	// capyctl help exit-codes explains 29.
	out, _, code := run(t, nil, "help", "exit-codes")
	want(t, "help exit-codes", code, 0, out, "Exit 29: ", "address_in_use", "--listen")
	if _, ok := exitMeaning(29); !ok {
		t.Fatal("exit 29 has no meaning of its own")
	}
}

// exitMeaning is the meaning capyctl help exit-codes gives an exit code.
func exitMeaning(exit int) (string, bool) {
	for _, r := range command.ExitCodes() {
		if r.Exit == exit {
			return r.Meaning, r.Meaning != "" && !strings.HasPrefix(r.Meaning, strconv.Itoa(exit))
		}
	}
	return "", false
}

// TestFirstHour_DeployConverges: capyctl deploy --file converges, as
// Nomad's job run and kubectl apply do. The same file twice exits 0 the
// second time saying nothing changed, and restarts nothing; a changed file
// is a new revision; --revision N stays a compare-and-set. The management
// API does the same: a PUT of the spec a deployment has is a no-op, a PUT
// without expected_revision creates or replaces.
func TestFirstHour_DeployConverges(t *testing.T) {
	r := harness.StartStandalone(t, harness.Options{})
	r.AddFakeEngine("fake")
	spec := harness.SimpleSpec("conv", "fake")

	out, errOut, code := r.Deploy("conv", spec, "--activate", "--wait")
	want(t, "first deploy", code, 0, out+errOut, "Deployment conv created (revision 1, running)")
	pid := e2e.Status(t, r, "conv").Instances[0].PID
	out, errOut, code = r.Deploy("conv", spec)
	want(t, "the same file again", code, 0, out+errOut, "Deployment conv unchanged (revision 1, running)")
	out, _, code = r.Deploy("conv", spec, "--json")
	var accs []wire.DeployAccepted
	oneLineJSON(t, "deploy --json of the same file", out, &accs)
	if code != 0 || len(accs) != 1 || !accs[0].Unchanged || accs[0].Created || accs[0].Revision != 1 {
		t.Fatalf("deploy --json of the same file: %+v", accs)
	}
	// The same spec named by its revision is a no-op too.
	out, errOut, code = r.Deploy("conv", spec, "--revision", "1")
	want(t, "the same file with --revision 1", code, 0, out+errOut, "unchanged (revision 1")
	if st := e2e.Status(t, r, "conv"); st.Revision != 1 || st.Instances[0].PID != pid || st.State != "ready" {
		t.Fatalf("an unchanged deploy touched the deployment: revision %d, pid %d (was %d), state %s", st.Revision, st.Instances[0].PID, pid, st.State)
	}

	changed := strings.Replace(spec, "  model {", "  request_deadline = \"90s\"\n  model {", 1)
	out, errOut, code = r.Deploy("conv", changed)
	want(t, "a changed file", code, 0, out+errOut, "Deployment conv updated to revision 2")
	out, errOut, code = r.Deploy("conv", spec, "--revision", "1")
	want(t, "--revision of a replaced revision", code, 2, out+errOut, "error [revision_conflict]", "revision 2")
	out, errOut, code = r.Deploy("conv", spec, "--revision", "2")
	want(t, "--revision of the current revision", code, 0, out+errOut, "Deployment conv updated to revision 3")

	// The API: PUT without expected_revision creates, then is a no-op.
	body := `{"deployment":{"name":"viaapi","engine":"fake","model":{"path":"conv"}}}`
	for i, wantStatus := range []int{201, 200} {
		status, answer := mgmtPut(t, r, "/management/v1/deployments/viaapi", body)
		var acc wire.DeployAccepted
		if err := json.Unmarshal([]byte(answer), &acc); err != nil || status != wantStatus || acc.Revision != 1 ||
			acc.Created != (i == 0) || acc.Unchanged != (i == 1) {
			t.Fatalf("PUT %d: %d %s", i+1, status, answer)
		}
	}
	// A POST of an existing deployment stays a conflict, pointing at PUT.
	status, answer := mgmtDo(t, r, "POST", "/management/v1/deployments", body)
	if status != 409 || !strings.Contains(answer, "PUT /deployments/viaapi") {
		t.Fatalf("POST of an existing deployment: %d %s", status, answer)
	}
}

func mgmtPut(t *testing.T, r *harness.Role, path, body string) (int, string) {
	t.Helper()
	return mgmtDo(t, r, "PUT", path, body)
}

// mgmtDo sends a management API request with the admin token.
func mgmtDo(t *testing.T, r *harness.Role, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+r.Info.Management+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+r.Creds.AdminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, harness.ReadAll(resp)
}

// TestFirstHour_OutputDetails: what the CLI prints reads as the inputs do.
// An unknown --format is refused; list deployments --json is an object
// like every list; a --wait that runs out of its --timeout is
// activation_timeout (exit 10), not role_not_running; durations print as
// they are written ("10m", not "10m0s"); lists in messages are words, not
// Go's [a b].
func TestFirstHour_OutputDetails(t *testing.T) {
	_, errOut, code := run(t, nil, "version", "--format", "yaml")
	want(t, "--format yaml", code, 2, errOut, "error [invalid_request]", `--format "yaml"`, "text or json")
	out, _, code := run(t, nil, "version", "--format", "json")
	if code != 0 || !strings.HasPrefix(out, "{") {
		t.Fatalf("--format json: exit %d %s", code, out)
	}

	r := harness.StartStandalone(t, harness.Options{})
	r.AddFakeEngine("slow", "--startup-delay", "3s")
	if out, errOut, code := r.Deploy("late", harness.SimpleSpec("late", "slow")); code != 0 {
		t.Fatalf("deploy: exit %d %s%s", code, out, errOut)
	}
	if out, errOut, code := r.Deploy("later", harness.SimpleSpec("later", "slow")); code != 0 {
		t.Fatalf("deploy: exit %d %s%s", code, out, errOut)
	}
	_, errOut, code = r.CLI("start", "deployment", "late", "--wait", "--timeout", "1ms")
	want(t, "start --wait --timeout 1ms", code, structs.Lookup(structs.CodeActivationTimeout).Exit, errOut, "error [activation_timeout]", "late")

	out, _, code = r.CLI("list", "deployments", "--json")
	var list wire.DeploymentList
	oneLineJSON(t, "list deployments --json", out, &list)
	if code != 0 || list.APIVersion == "" || len(list.Deployments) != 2 {
		t.Fatalf("list deployments --json: %s", out)
	}

	_, errOut, code = r.CLI("engine", "remove", "slow")
	want(t, "engine remove of a used engine", code, structs.Lookup(structs.CodeEngineInUse).Exit, errOut, "used by late, later;")

	out, _, code = r.CLI("config", "show")
	want(t, "config show", code, 0, out, " 10m ", " 168h ")
	if strings.Contains(out, "m0s") {
		t.Fatalf("config show prints Go durations:\n%s", out)
	}
}

// TestFirstHour_FakeEngineInsideCapyctl: capyctl runs the fake engine as
// `capyctl fake-engine`, and under an engine's program name only with
// CAPYCTL_FAKE_ENGINE=1: a capyctl that happens to be named llama-server
// stays the CLI.
func TestFirstHour_FakeEngineInsideCapyctl(t *testing.T) {
	bin, _ := harness.Binaries(t)
	link := filepath.Join(t.TempDir(), "llama-server")
	if err := os.Symlink(bin, link); err != nil {
		t.Fatal(err)
	}
	version := func(env ...string) string {
		t.Helper()
		cmd := exec.Command(link, "--version")
		cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("llama-server --version: %v\n%s", err, out)
		}
		return string(out)
	}
	if out := version(); !strings.HasPrefix(out, "capyctl ") {
		t.Fatalf("capyctl named llama-server without CAPYCTL_FAKE_ENGINE=1 ran as: %q", out)
	}
	if out := version("CAPYCTL_FAKE_ENGINE=1"); !strings.Contains(out, "built with") || strings.HasPrefix(out, "capyctl ") {
		t.Fatalf("capyctl named llama-server with CAPYCTL_FAKE_ENGINE=1 ran as: %q", out)
	}
	// The generic fake: serve without a served name is the fake's refusal
	// (exit 2), not the CLI's unknown command.
	_, errOut, code := run(t, nil, "fake-engine", "serve")
	want(t, "capyctl fake-engine serve", code, 2, errOut, "capyctl-fake-engine: ", "served name is required")
}
