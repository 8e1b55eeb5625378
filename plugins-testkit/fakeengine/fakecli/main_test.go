// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakecli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/simgpu"
)

// The test binary doubles as the fake engine: with this variable set it
// runs main's code instead of the tests, so the tests drive a real process.
const beMainEnv = "CAPYCTL_FAKE_ENGINE_TEST_BE_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(beMainEnv) == "1" {
		os.Exit(run(os.Args[0], os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// syncBuffer is a bytes.Buffer safe for a writer and readers at once.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// engineProc is a fake engine process.
type engineProc struct {
	cmd    *exec.Cmd
	stdout *syncBuffer
	stderr *syncBuffer
	done   chan struct{}
	url    string
}

// startProc runs the binary as argv0 with args and extra environment.
func startProc(t *testing.T, argv0 string, args []string, env ...string) *engineProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Args[0] = argv0
	for _, kv := range os.Environ() { // a clean slate for the knobs
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "CAPYCTL_FAKE_") || name == "CAPYCTL_SIMGPU_STATE" || name == "CUDA_VISIBLE_DEVICES" || name == "FAKE_ENGINE_API_KEY" {
			continue
		}
		cmd.Env = append(cmd.Env, kv)
	}
	cmd.Env = append(cmd.Env, beMainEnv+"=1")
	cmd.Env = append(cmd.Env, env...)
	p := &engineProc{cmd: cmd, stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.stdout, p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("engine stdout:\n%s\nengine stderr:\n%s", p.stdout, p.stderr)
		}
	})
	return p
}

// serve starts "capyctl-fake-engine serve" with args and waits for the
// listening line.
func serve(t *testing.T, args []string, env ...string) *engineProc {
	t.Helper()
	p := startProc(t, "capyctl-fake-engine", append([]string{"serve"}, args...), env...)
	p.waitListening(t)
	return p
}

var listeningRE = regexp.MustCompile(`listening on (\S+)`)

// waitListening waits for the "listening on ADDR" line and sets url.
func (p *engineProc) waitListening(t *testing.T) string {
	t.Helper()
	var addr string
	p.waitFor(t, "the listening line", func() bool {
		if m := listeningRE.FindStringSubmatch(p.stdout.String()); m != nil {
			addr = m[1]
			return true
		}
		return false
	})
	_, port, _ := strings.Cut(addr, ":")
	p.url = "http://127.0.0.1:" + port
	return addr
}

// waitFor polls cond with a deadline, failing early if the process ends.
func (p *engineProc) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		select {
		case <-p.done:
			if cond() {
				return
			}
			t.Fatalf("engine exited (%v) while waiting for %s", p.cmd.ProcessState, what)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// wait waits for the process to exit and returns its exit code.
func (p *engineProc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatal("engine did not exit")
	}
	return p.cmd.ProcessState.ExitCode()
}

// get sends a GET and returns the status and body; status 0 when the
// request fails.
func (p *engineProc) get(path string, header ...string) (int, string) {
	req, _ := http.NewRequest(http.MethodGet, p.url+path, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

// chat posts a small chat request.
func (p *engineProc) chat(t *testing.T, model string) (int, string) {
	t.Helper()
	body := `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}]}`
	resp, err := http.Post(p.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

func TestRun_Dispatch(t *testing.T) {
	cases := []struct {
		name       string
		argv0      string
		args       []string
		wantCode   int
		wantStderr string
	}{
		{name: "no arguments", argv0: "capyctl-fake-engine", wantCode: 2, wantStderr: `unknown invocation "capyctl-fake-engine"`},
		{name: "unknown subcommand", argv0: "/usr/bin/capyctl-fake-engine", args: []string{"launch"}, wantCode: 2, wantStderr: `unknown invocation "capyctl-fake-engine launch"`},
		{name: "python module", argv0: "/venv/bin/python3", args: []string{"-u", "-m", "lmcache.v1.api_server", "--port", "1"}, wantCode: 2, wantStderr: `"python3 -m lmcache.v1.api_server"`},
		{name: "python serve is not the generic serve", argv0: "python", args: []string{"serve"}, wantCode: 2, wantStderr: `unknown invocation "python serve"`},
		{name: "llama-server", argv0: "llama-server", args: []string{"-m", "model.gguf", "--port", "8080"}, wantCode: 134, wantStderr: "error loading model"},
		{name: "tensorfold serve", argv0: "tensorfold", args: []string{"serve", "--model", "x"}, wantCode: 2, wantStderr: "model directory comes first"},
		{name: "serve help", argv0: "capyctl-fake-engine", args: []string{"serve", "-h"}, wantCode: 0, wantStderr: "CAPYCTL_FAKE_"},
		{name: "serve bad flag", argv0: "capyctl-fake-engine", args: []string{"serve", "--served-name", "m", "--bogus"}, wantCode: 2, wantStderr: "bogus"},
		{name: "serve without a name", argv0: "capyctl-fake-engine", args: []string{"serve"}, wantCode: 2, wantStderr: "served name is required"},
		{name: "serve stray argument", argv0: "capyctl-fake-engine", args: []string{"serve", "--served-name", "m", "extra"}, wantCode: 2, wantStderr: "unexpected arguments"},
		{name: "serve unknown flavour", argv0: "capyctl-fake-engine", args: []string{"serve", "--served-name", "m", "--flavour", "nope"}, wantCode: 2, wantStderr: `unknown flavour "nope"`},
		{name: "serve bad env knob", argv0: "capyctl-fake-engine", args: []string{"serve", "--served-name", "m"}, wantCode: 2, wantStderr: "CAPYCTL_FAKE_TOKENS"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			env := func(name string) string {
				if c.name == "serve bad env knob" && name == "CAPYCTL_FAKE_TOKENS" {
					return "many"
				}
				return ""
			}
			code := run(c.argv0, c.args, env, &stdout, &stderr)
			if code != c.wantCode || !strings.Contains(stderr.String(), c.wantStderr) {
				t.Fatalf("exit %d, want %d; stderr:\n%s", code, c.wantCode, stderr.String())
			}
		})
	}
}

func TestServe_StartupDelay(t *testing.T) {
	p := serve(t, []string{"--served-name", "m", "--startup-delay", "2s"})
	if status, body := p.get("/health"); status != http.StatusServiceUnavailable || strings.TrimSpace(body) != `{"status":"loading"}` {
		t.Fatalf("health right after listening: %d %s", status, body)
	}
	p.waitFor(t, "health 200", func() bool { status, _ := p.get("/health"); return status == http.StatusOK })
	if status, body := p.chat(t, "m"); status != http.StatusOK {
		t.Fatalf("chat when ready: %d %s", status, body)
	}
	if !strings.Contains(p.stdout.String(), "INFO") || !strings.Contains(p.stdout.String(), "ready") {
		t.Fatalf("log lacks the ready line:\n%s", p.stdout)
	}
}

func TestServe_ExitDuringStartup(t *testing.T) {
	cases := []struct {
		name string
		args []string
		env  []string
		want int
	}{
		{name: "flag", args: []string{"--exit-during-startup", "3"}, want: 3},
		{name: "environment", env: []string{"CAPYCTL_FAKE_EXIT_DURING_STARTUP=42"}, want: 42},
		{name: "after a delay", args: []string{"--exit-during-startup", "5", "--startup-delay", "50ms"}, want: 5},
		{name: "clean exit", args: []string{"--exit-during-startup", "0"}, want: 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := startProc(t, "capyctl-fake-engine", append([]string{"serve", "--served-name", "m"}, c.args...), c.env...)
			if code := p.wait(t); code != c.want {
				t.Fatalf("exit code %d, want %d", code, c.want)
			}
			if !strings.Contains(p.stderr.String(), "ERROR") || !strings.Contains(p.stdout.String(), "loading") {
				t.Fatalf("want a few log lines and an error line; stdout:\n%s\nstderr:\n%s", p.stdout, p.stderr)
			}
		})
	}
}

func TestServe_Signals(t *testing.T) {
	cases := []struct {
		name string
		sig  syscall.Signal
	}{
		{name: "SIGTERM", sig: syscall.SIGTERM},
		{name: "SIGINT", sig: syscall.SIGINT},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := serve(t, []string{"--served-name", "m"})
			p.waitFor(t, "ready", func() bool { status, _ := p.get("/health"); return status == 200 })
			if err := p.cmd.Process.Signal(c.sig); err != nil {
				t.Fatal(err)
			}
			if code := p.wait(t); code != 0 {
				t.Fatalf("exit code %d, want 0", code)
			}
			if !strings.Contains(p.stdout.String(), "stopped") {
				t.Fatalf("no graceful shutdown in the log:\n%s", p.stdout)
			}
		})
	}
}

func TestServe_CrashAfter(t *testing.T) {
	p := serve(t, []string{"--served-name", "m", "--crash-after", "1"})
	p.waitFor(t, "ready", func() bool { status, _ := p.get("/health"); return status == 200 })
	if status, body := p.chat(t, "m"); status != 200 {
		t.Fatalf("first request: %d %s", status, body)
	}
	if code := p.wait(t); code != 1 {
		t.Fatalf("exit code %d, want 1", code)
	}
}

func TestServe_ListenAll(t *testing.T) {
	p := startProc(t, "capyctl-fake-engine", []string{"serve", "--served-name", "m", "--listen-all"})
	if addr := p.waitListening(t); !strings.HasPrefix(addr, "0.0.0.0:") {
		t.Fatalf("listening on %s, want 0.0.0.0", addr)
	}
	p.waitFor(t, "ready", func() bool { status, _ := p.get("/health"); return status == 200 })
}

func TestServe_EnvironmentKnobs(t *testing.T) {
	p := serve(t, []string{"--served-name", "m", "--max-running", "3"},
		"CAPYCTL_FAKE_TOKENS=3", "CAPYCTL_FAKE_MAX_RUNNING=9", "FAKE_ENGINE_API_KEY=sk-env")
	p.waitFor(t, "ready", func() bool { status, _ := p.get("/health"); return status == 200 })
	if status, _ := p.get("/fake/stats"); status != http.StatusUnauthorized {
		t.Fatalf("stats without the key: %d", status)
	}
	status, body := p.get("/fake/stats", "Authorization", "Bearer sk-env")
	var st struct {
		MaxRunning int `json:"max_running"`
	}
	if status != 200 || json.Unmarshal([]byte(body), &st) != nil || st.MaxRunning != 3 {
		t.Fatalf("stats: %d %s (the flag must win over the environment)", status, body)
	}
	req, _ := http.NewRequest("POST", p.url+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer sk-env")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var cc struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	json.NewDecoder(resp.Body).Decode(&cc)
	if cc.Usage.CompletionTokens != 3 {
		t.Fatalf("answer of %d tokens, want 3 from CAPYCTL_FAKE_TOKENS", cc.Usage.CompletionTokens)
	}
}

func TestServe_HostAllocAndSecret(t *testing.T) {
	const n = 64 << 20
	p := serve(t, []string{"--served-name", "m", "--host-alloc", "64MiB", "--log-secret"}, "FAKE_ENGINE_API_KEY=sk-shown")
	p.waitFor(t, "ready", func() bool { return strings.Contains(p.stdout.String(), "ready") })
	if !strings.Contains(p.stdout.String(), "sk-shown") {
		t.Fatalf("the key is not printed:\n%s", p.stdout)
	}
	rss, err := residentBytes(p.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if rss < n {
		t.Fatalf("resident %d bytes, want at least %d", rss, n)
	}
}

// residentBytes reads VmRSS from /proc/<pid>/status.
func residentBytes(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmRSS")
}

// newSimGPU creates a simulated GPU with two devices of total bytes.
func newSimGPU(t *testing.T, total int64) (*simgpu.GPU, []simgpu.Device) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "simgpu.json")
	devs := simgpu.DefaultDevices(2, total)
	if err := simgpu.Create(path, devs); err != nil {
		t.Fatal(err)
	}
	g, err := simgpu.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	return g, devs
}

// holdings is what pid holds, per device and tag ("<index>/<tag>").
func holdings(t *testing.T, g *simgpu.GPU, devs []simgpu.Device, pid int) map[string]int64 {
	t.Helper()
	st, err := g.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	index := map[string]int{}
	for _, d := range devs {
		index[d.UUID] = d.Index
	}
	out := map[string]int64{}
	for _, a := range st.Allocations {
		if a.PID == pid {
			out[fmt.Sprintf("%d/%s", index[a.DeviceUUID], a.Tag)] += a.Bytes
		}
	}
	return out
}

func TestServe_SimulatedGPU(t *testing.T) {
	g, devs := newSimGPU(t, 8<<30)
	hold := filepath.Join(t.TempDir(), "go")
	p := serve(t, []string{"--served-name", "m", "--hold-startup-file", hold,
		"--sim-weights", "2GiB", "--sim-kv", "1GiB", "--sim-startup-peak", "512MiB", "--sim-park-residue", "256MiB"},
		"CAPYCTL_SIMGPU_STATE="+g.Path(), "CUDA_VISIBLE_DEVICES="+devs[1].UUID)
	pid := p.cmd.Process.Pid
	want := map[string]int64{"1/weights": 2 << 30, "1/kv_cache": 1 << 30, "1/startup_peak": 512 << 20}
	p.waitFor(t, "startup allocations", func() bool { return fmt.Sprint(holdings(t, g, devs, pid)) == fmt.Sprint(want) })
	if status, _ := p.get("/health"); status != http.StatusServiceUnavailable {
		t.Fatalf("health while holding the startup: %d", status)
	}

	if err := os.WriteFile(hold, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	p.waitFor(t, "ready", func() bool { status, _ := p.get("/health"); return status == 200 })
	want = map[string]int64{"1/weights": 2 << 30, "1/kv_cache": 1 << 30}
	if got := holdings(t, g, devs, pid); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("when ready: %v, want %v (the peak released)", got, want)
	}
	used, per, err := g.Usage(devs[1].UUID)
	if err != nil || used != 3<<30 || per[pid] != 3<<30 {
		t.Fatalf("usage of device 1: %d %v %v", used, per, err)
	}

	// kill -9: no cleanup runs in the engine, yet its entries vanish.
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	p.waitFor(t, "the allocations to vanish", func() bool { return len(holdings(t, g, devs, pid)) == 0 })
}

func TestServe_SimulatedOutOfMemory(t *testing.T) {
	g, devs := newSimGPU(t, 4<<30)
	// Another process already holds most of device 0.
	holder := startProc(t, "capyctl-fake-engine", []string{"serve", "--served-name", "holder", "--sim-weights", "3GiB"},
		"CAPYCTL_SIMGPU_STATE="+g.Path())
	holder.waitFor(t, "the holder's memory", func() bool { return len(holdings(t, g, devs, holder.cmd.Process.Pid)) == 1 })

	p := startProc(t, "capyctl-fake-engine", []string{"serve", "--served-name", "m", "--sim-weights", "2GiB"},
		"CAPYCTL_SIMGPU_STATE="+g.Path(), "CUDA_VISIBLE_DEVICES=0")
	if code := p.wait(t); code != 1 {
		t.Fatalf("exit code %d, want 1", code)
	}
	if !strings.Contains(p.stderr.String(), "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 4.00 GiB of which 1.00 GiB is free") {
		t.Fatalf("no CUDA-like out-of-memory line:\n%s", p.stderr)
	}
}
