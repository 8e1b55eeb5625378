// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package role_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capyctl/capyctl/cmd/capyctl/internal/e2e"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

func TestFoundation_StreamedChatThroughRole(t *testing.T) {
	r := e2e.StartWithDemo(t)
	// Credentials: made on the first start, owner-only, never in a log.
	for path, want := range map[string]os.FileMode{r.StateDir: 0o700, filepath.Join(r.StateDir, "credentials"): 0o600} {
		st, err := os.Stat(path)
		if err != nil || st.Mode().Perm() != want {
			t.Fatalf("%s: %v %v, want %v", path, st.Mode().Perm(), err, want)
		}
	}
	t.Cleanup(func() {
		out := r.Output()
		if strings.Contains(out, r.Creds.APIKey) || strings.Contains(out, r.Creds.AdminToken) {
			t.Errorf("a credential appeared in the role's log")
		}
		logs, _ := filepath.Glob(filepath.Join(r.StateDir, "launches", "*", "*", "engine.log"))
		for _, l := range logs {
			if b, _ := os.ReadFile(l); strings.Contains(string(b), r.Creds.APIKey) {
				t.Errorf("the API key appeared in %s", l)
			}
		}
	})
	resp, err := r.Chat(context.Background(), harness.ChatBody("demo", true, "Hello there"), map[string]string{"X-Request-Id": "client-42"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, harness.ReadAll(resp))
	}
	if id := resp.Header.Get("X-CapyCTL-Request-Id"); id == "" {
		t.Fatalf("no X-CapyCTL-Request-Id")
	}
	if got := resp.Header.Get("X-Request-Id"); got != "client-42" {
		t.Fatalf("X-Request-Id = %q, want the client's", got)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("content type %q", ct)
	}
	sc := bufio.NewScanner(resp.Body)
	var data []string
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "data: ") {
			data = append(data, strings.TrimPrefix(l, "data: "))
		}
	}
	resp.Body.Close()
	if len(data) < 3 || data[len(data)-1] != "[DONE]" {
		t.Fatalf("stream did not end with data: [DONE]: %v", data)
	}
	var chunk struct {
		Object  string `json:"object"`
		Choices []struct {
			Delta struct{ Content string } `json:"delta"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(data[1]), &chunk); err != nil || chunk.Object != "chat.completion.chunk" {
		t.Fatalf("chunk %q: %v", data[1], err)
	}

	// /v1/models lists the route without waking anything.
	req, _ := http.NewRequest(http.MethodGet, r.InferenceURL()+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer "+r.Creds.APIKey)
	mresp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if body := harness.ReadAll(mresp); !strings.Contains(body, `"id":"demo"`) || !strings.Contains(body, `"api":"chat"`) {
		t.Fatalf("models: %s", body)
	}
}

func TestFoundation_BadInput(t *testing.T) {
	r := e2e.StartWithDemo(t)

	t.Run("malformed HCL", func(t *testing.T) {
		f := r.WriteFile("specs/bad.hcl", "deployment \"x\" {\n  engine = \"fake\"\n  model {\n    path = \n  }\n}\n")
		for _, cmd := range [][]string{{"validate", "config", "--file", f}, {"deploy", "--file", f}} {
			_, errOut, code := r.CLI(cmd...)
			if code != 2 {
				t.Fatalf("%v: exit %d, want 2: %s", cmd, code, errOut)
			}
			if !strings.Contains(errOut, "bad.hcl:4:") || !strings.Contains(errOut, "invalid_config") {
				t.Fatalf("%v: no file:line:col in %q", cmd, errOut)
			}
		}
	})

	cases := []struct {
		name       string
		body       string
		headers    map[string]string
		wantStatus int
		wantCode   string
	}{
		{"unknown model", harness.ChatBody("nope", false, "hi"), nil, 404, "unknown_model"},
		{"missing key", harness.ChatBody("demo", false, "hi"), map[string]string{"Authorization": ""}, 401, "unauthorized"},
		{"wrong key", harness.ChatBody("demo", false, "hi"), map[string]string{"Authorization": "Bearer capy-wrong"}, 401, "unauthorized"},
		{"not JSON", "this is not json", nil, 400, "invalid_request"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, err := r.Chat(context.Background(), c.body, c.headers)
			if err != nil {
				t.Fatal(err)
			}
			body := harness.ReadAll(resp)
			if resp.StatusCode != c.wantStatus {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.wantStatus, body)
			}
			var env struct {
				Error struct{ Code string } `json:"error"`
			}
			if err := json.Unmarshal([]byte(body), &env); err != nil || env.Error.Code != c.wantCode {
				t.Fatalf("code %q, want %q: %s", env.Error.Code, c.wantCode, body)
			}
			if resp.Header.Get("X-CapyCTL-Request-Id") == "" {
				t.Fatalf("no request id on an error answer")
			}
		})
	}

	t.Run("manifest program missing", func(t *testing.T) {
		m := r.WriteFile("manifests/missing.hcl", harness.FakeManifest())
		_, errOut, code := r.CLI("engine", "add", "--custom", r.StateDir+"/no-such-program", "--name", "missing", "--manifest", m, "--yes")
		if code != 16 || !strings.Contains(errOut, "engine_not_found") || !strings.Contains(errOut, "no-such-program") {
			t.Fatalf("exit %d: %s", code, errOut)
		}
	})

	t.Run("engine listens off loopback", func(t *testing.T) {
		r.AddFakeEngine("wide", "--listen-all")
		_, errOut, code := r.Deploy("wide", harness.SimpleSpec("wide", "wide"), "--activate", "--wait")
		if code != 13 || !strings.Contains(errOut, "engine_listens_off_loopback") || !strings.Contains(errOut, "0.0.0.0") {
			t.Fatalf("exit %d, want 13 engine_listens_off_loopback: %s", code, errOut)
		}
		st := e2e.Status(t, r, "wide")
		if st.Instances[0].State != "failed" || st.Instances[0].PID != 0 {
			t.Fatalf("after the refused start: %+v", st.Instances[0])
		}
	})

	t.Run("changed program is refused", func(t *testing.T) {
		prog := filepath.Join(r.StateDir, "bin", "copied-fake")
		if err := os.MkdirAll(filepath.Dir(prog), 0o700); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(r.FakeBin)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(prog, data, 0o700); err != nil {
			t.Fatal(err)
		}
		m := r.WriteFile("manifests/copied.hcl", harness.FakeManifest())
		if out, errOut, code := r.CLI("engine", "add", "--custom", prog, "--name", "copied", "--manifest", m, "--yes"); code != 0 {
			t.Fatalf("engine add: %d %s%s", code, out, errOut)
		}
		// The pinned program changes after it was confirmed.
		if err := os.WriteFile(prog, append(data, 0), 0o700); err != nil {
			t.Fatal(err)
		}
		_, errOut, code := r.Deploy("copied", harness.SimpleSpec("copied", "copied"), "--activate", "--wait")
		if code != 17 || !strings.Contains(errOut, "installation_drift") {
			t.Fatalf("exit %d, want 17 installation_drift: %s", code, errOut)
		}
	})

	t.Run("engine exits while starting", func(t *testing.T) {
		r.AddFakeEngine("dying", "--exit-during-startup", "3")
		_, errOut, code := r.Deploy("dies", harness.SimpleSpec("dies", "dying"), "--activate", "--wait")
		if code != 13 {
			t.Fatalf("exit %d, want 13: %s", code, errOut)
		}
		if !strings.Contains(errOut, "launch_failed") || !strings.Contains(errOut, "exited with code 3") || !strings.Contains(errOut, "last log lines") {
			t.Fatalf("no reason with log lines: %s", errOut)
		}
	})
}

func TestFoundation_KillDriverKeepsServing(t *testing.T) {
	r := e2e.StartWithDemo(t)
	before := e2e.Status(t, r, "demo").Instances[0].PID
	pids := harness.DriverPIDs(r.StateDir, "custom")
	if len(pids) != 1 {
		t.Fatalf("driver processes %v", pids)
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Requests never touch the driver: they keep being answered.
	e2e.ChatOK(t, r, "demo")
	harness.Eventually(t, 30*time.Second, "a relaunched driver", func() bool {
		now := harness.DriverPIDs(r.StateDir, "custom")
		return len(now) == 1 && now[0] != pids[0]
	})
	st := e2e.Status(t, r, "demo")
	if st.State != "ready" || st.Instances[0].PID != before {
		t.Fatalf("after the driver crash: state %s pid %d (was %d)", st.State, st.Instances[0].PID, before)
	}
	e2e.ChatOK(t, r, "demo")
	// The relaunched driver has re-attached: a stop goes through it.
	if _, errOut, code := r.CLI("stop", "deployment", "demo", "--wait"); code != 0 {
		t.Fatalf("stop: %s", errOut)
	}
	if harness.Alive(before) {
		t.Fatalf("engine %d still alive after stop", before)
	}
}

func TestFoundation_KillCoreReattaches(t *testing.T) {
	r := e2e.StartWithDemo(t)
	engine := e2e.Status(t, r, "demo").Instances[0].PID
	drivers := harness.DriverPIDs(r.StateDir, "custom")
	r.Kill9()
	if !harness.Alive(engine) {
		t.Fatalf("the engine died with the core")
	}
	r.Restart()
	st := e2e.Status(t, r, "demo")
	if st.State != "ready" || st.Instances[0].PID != engine {
		t.Fatalf("after restart: state %s pid %d, want ready %d\n%s", st.State, st.Instances[0].PID, engine, r.Output())
	}
	// The restarted core re-attached to the driver that survived it.
	if now := harness.DriverPIDs(r.StateDir, "custom"); len(drivers) != 1 || len(now) != 1 || now[0] != drivers[0] {
		t.Fatalf("driver processes %v before the crash, %v after: not re-attached\n%s", drivers, now, r.Output())
	}
	e2e.ChatOK(t, r, "demo")
}

func TestFoundation_RoleStopLeavesEnginesStopDeploymentEndsThem(t *testing.T) {
	r := e2e.StartWithDemo(t)
	engine := e2e.Status(t, r, "demo").Instances[0].PID
	r.Stop()
	if !harness.Alive(engine) {
		t.Fatalf("stopping the role stopped the engine")
	}
	r.Restart()
	if st := e2e.Status(t, r, "demo"); st.Instances[0].PID != engine || st.State != "ready" {
		t.Fatalf("after a clean restart: %+v", st)
	}
	e2e.ChatOK(t, r, "demo")
	if _, errOut, code := r.CLI("stop", "deployment", "demo", "--wait"); code != 0 {
		t.Fatalf("stop: %s", errOut)
	}
	if left := harness.EnginePIDs(r.StateDir); len(left) != 0 {
		t.Fatalf("processes left after stop deployment: %v", left)
	}
	// A stopped deployment refuses requests with 409 until started again.
	resp, err := r.Chat(context.Background(), harness.ChatBody("demo", false, "hi"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if body := harness.ReadAll(resp); resp.StatusCode != 409 || !strings.Contains(body, "deployment_stopped") {
		t.Fatalf("request to a stopped deployment: %d %s", resp.StatusCode, body)
	}
}

func TestFoundation_DevServesAndLeavesNothing(t *testing.T) {
	bin, _ := harness.Binaries(t)
	cmd := exec.Command(bin, "dev", "--listen", "127.0.0.1:0")
	tmp := t.TempDir()
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		harness.KillLeftovers(tmp) // what a failed run left: drivers, engines
	}()
	var endpoint, key, state string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "Endpoint: "):
			endpoint = strings.TrimSpace(strings.TrimPrefix(line, "Endpoint: "))
		case strings.HasPrefix(line, "API key: "):
			key = strings.TrimSpace(strings.TrimPrefix(line, "API key: "))
		case strings.HasPrefix(line, "State: "):
			state = strings.TrimSpace(strings.TrimPrefix(line, "State: "))
		}
		if strings.HasPrefix(line, "Press Ctrl-C") {
			break
		}
	}
	if endpoint == "" || key == "" || state == "" {
		t.Fatalf("dev printed no endpoint/key/state")
	}
	go func() {
		for sc.Scan() {
		}
	}()
	req, _ := http.NewRequest(http.MethodPost, endpoint+"/chat/completions", strings.NewReader(harness.ChatBody("demo", true, "Hello")))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body := harness.ReadAll(resp)
	if resp.StatusCode != 200 || !strings.HasSuffix(strings.TrimSpace(body), "data: [DONE]") || resp.Header.Get("X-CapyCTL-Request-Id") == "" {
		t.Fatalf("streamed request: %d %q", resp.StatusCode, body)
	}
	if len(harness.EnginePIDs(state)) == 0 {
		t.Fatalf("no engine process found under %s", state)
	}
	// The two switching models: each request wakes its model and parks the
	// other to make room on the simulated card.
	for _, model := range []string{"chat-a", "chat-b", "chat-a"} {
		req, _ := http.NewRequest(http.MethodPost, endpoint+"/chat/completions", strings.NewReader(harness.ChatBody(model, false, "Hello")))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if body := harness.ReadAll(resp); resp.StatusCode != 200 {
			t.Fatalf("dev request for %s: %d %s", model, resp.StatusCode, body)
		}
	}
	out, errOut, code := harness.RunCLI(t, bin, []string{"status", "deployment", "chat-b", "--json", "--state-dir", state}, nil)
	if code != 0 || !strings.Contains(out, `"state":"parked"`) {
		t.Fatalf("chat-b after chat-a's request: exit %d %s %s", code, out, errOut)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("dev exit: %v", err)
	}
	if left := harness.Leftovers(state); len(left) != 0 {
		t.Fatalf("processes left after Ctrl-C: %v", left)
	}
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Fatalf("temporary state directory %s remains", state)
	}
}

func TestFoundation_EngineDiesWhileReadyStartsAgain(t *testing.T) {
	r := harness.StartStandalone(t, harness.Options{})
	// Each engine answers its readiness check and one request, then dies.
	r.AddFakeEngine("fragile", "--crash-after", "2")
	r.MustDeploy("fragile", harness.SimpleSpec("fragile", "fragile"))
	in := e2e.Status(t, r, "fragile").Instances[0]
	first, gen := in.PID, in.Generation
	e2e.ChatOK(t, r, "fragile")
	harness.Eventually(t, 30*time.Second, "the death to be noticed", func() bool {
		in := e2e.Status(t, r, "fragile").Instances[0]
		return in.State == "stopped" && in.LastError != nil && in.LastError.Code == "engine_error"
	})
	if harness.Alive(first) {
		t.Fatalf("engine %d still alive", first)
	}
	// The next request starts it again (a new launch of the instance).
	e2e.ChatOK(t, r, "fragile")
	if in := e2e.Status(t, r, "fragile").Instances[0]; in.Generation <= gen {
		t.Fatalf("no new launch: generation %d, was %d", in.Generation, gen)
	}
}
