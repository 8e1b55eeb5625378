// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakecli

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/capyctl/capyctl/plugins-testkit/simgpu"
)

// fakeVenv makes <dir>/venv with a dist-info of dist at version (and
// extra files under site-packages) and returns the interpreter path the
// engine is run as.
func fakeVenv(t *testing.T, dist, version string, extra map[string]string) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "venv")
	sp := filepath.Join(root, "lib", "python3.12", "site-packages")
	files := map[string]string{
		filepath.Join(sp, dist+"-"+version+".dist-info", "METADATA"): "Metadata-Version: 2.1\nName: " + dist + "\nVersion: " + version + "\n\nbody\n",
	}
	for k, v := range extra {
		files[filepath.Join(sp, k)] = v
	}
	for p, s := range files {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "bin", "python")
}

// modelDir makes a model directory with a sparse weights file of size n.
func modelDir(t *testing.T, n int64) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "model")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(n); err != nil {
		t.Fatal(err)
	}
	f.Close()
	return dir
}

func TestRun_FlavourDispatch(t *testing.T) {
	cases := []struct {
		name       string
		argv0      string
		args       []string
		env        map[string]string
		wantCode   int
		wantStderr string
	}{
		{name: "vllm unknown option", argv0: "/v/bin/python", args: []string{"-m", vllmModule, "--model", "m", "--bogus-option"}, wantCode: 2, wantStderr: "unrecognized arguments: --bogus-option"},
		{name: "vllm without a model", argv0: "/v/bin/python", args: []string{"-m", vllmModule}, wantCode: 2, wantStderr: "required: --model"},
		{name: "vllm ambiguous abbreviation", argv0: "/v/bin/python", args: []string{"-m", vllmModule, "--model", "m", "--enable-log", "x"}, wantCode: 2, wantStderr: "ambiguous option"},
		{name: "vllm dev mode must be an integer", argv0: "/v/bin/python", args: []string{"-m", vllmModule, "--model", "m"},
			env: map[string]string{"VLLM_SERVER_DEV_MODE": "true"}, wantCode: 1, wantStderr: "invalid literal for int()"},
		{name: "vllm serve entry", argv0: "vllm", args: []string{"serve", "m", "--nope"}, wantCode: 2, wantStderr: "unrecognized arguments: --nope"},
		{name: "sglang unknown option", argv0: "/v/bin/python3", args: []string{"-m", sglangModule, "--model-path", "m", "--max_running_requests", "2"}, wantCode: 2, wantStderr: "unrecognized arguments"},
		{name: "sglang without a model", argv0: "/v/bin/python3", args: []string{"-m", sglangModule}, wantCode: 2, wantStderr: "required: --model-path"},
		{name: "sglang missing config", argv0: "/v/bin/python3", args: []string{"-m", sglangModule, "--model-path", "m", "--config", "/nonexistent.yaml"}, wantCode: 2, wantStderr: "argument --config"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(c.argv0, c.args, func(k string) string { return c.env[k] }, &stdout, &stderr)
			if code != c.wantCode || !strings.Contains(stderr.String(), c.wantStderr) {
				t.Fatalf("exit %d, want %d; stderr:\n%s", code, c.wantCode, stderr.String())
			}
		})
	}
}

func TestVLLMInvocation(t *testing.T) {
	py := fakeVenv(t, "vllm", "0.31.0", nil)
	state := filepath.Join(t.TempDir(), "gpu.json")
	dev := simgpu.DefaultDevices(1, 10<<30)[0]
	if err := simgpu.Create(state, []simgpu.Device{dev}); err != nil {
		t.Fatal(err)
	}
	model := modelDir(t, 1<<30)
	p := startProc(t, py, []string{"-m", vllmModule, "--model", model, "--served-model-name", "m", "--host", "127.0.0.1", "--port", "0",
		"--max-num-seqs", "4", "--kv-cache-memory-bytes", strconv.Itoa(2 << 30), "--enable-sleep-mode",
		"--no-enable-log-requests", "--no-enable-log-outputs"},
		"VLLM_API_KEY=sekrit", "VLLM_SERVER_DEV_MODE=1", "VLLM_NO_USAGE_STATS=1", "CAPYCTL_SIMGPU_STATE="+state)
	p.waitListening(t)
	p.waitFor(t, "ready", func() bool { s, _ := p.get("/health"); return s == 200 })
	if s, body := p.get("/version"); s != 200 || !strings.Contains(body, `"0.31.0"`) {
		t.Fatalf("version: %d %s", s, body)
	}
	if s, _ := p.get("/v1/models"); s != 401 {
		t.Fatalf("models without the key: %d", s)
	}
	if s, body := p.get("/v1/models", "Authorization", "Bearer sekrit"); s != 200 || !strings.Contains(body, `"root":"`+model+`"`) {
		t.Fatalf("models: %d %s", s, body)
	}
	if s, body := p.get("/fake/stats"); s != 200 || !strings.Contains(body, `"max_running":4`) ||
		!strings.Contains(body, fmt.Sprintf(`"weights":%d`, 1<<30)) || !strings.Contains(body, fmt.Sprintf(`"kv_cache":%d`, 2<<30)) {
		t.Fatalf("stats: %d %s", s, body)
	}
	if s, body := p.get("/is_sleeping"); s != 200 || !strings.Contains(body, "false") {
		t.Fatalf("dev mode route: %d %s", s, body)
	}
	if strings.Contains(p.stderr.String(), "Usage stats collection is enabled") {
		t.Fatalf("usage stats announced though VLLM_NO_USAGE_STATS=1:\n%s", p.stderr)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

func TestVLLMInvocation_Telemetry(t *testing.T) {
	py := fakeVenv(t, "vllm", "0.30.0", nil)
	p := startProc(t, py, []string{"-m", vllmModule, "--model", t.TempDir(), "--host", "127.0.0.1", "--port", "0"})
	p.waitListening(t)
	p.waitFor(t, "ready", func() bool { s, _ := p.get("/health"); return s == 200 })
	if !strings.Contains(p.stderr.String(), "Usage stats collection is enabled") {
		t.Fatalf("no usage stats warning without the opt-outs:\n%s", p.stderr)
	}
	if s, _ := p.get("/is_sleeping"); s != 404 {
		t.Fatalf("sleep without dev mode: %d", s)
	}
}

func TestSGLangInvocation(t *testing.T) {
	py := fakeVenv(t, "sglang", "0.5.22", map[string]string{
		"smg_grpc_servicer-1.0.dist-info/METADATA":         "Name: smg-grpc-servicer\nVersion: 1.0\n\n",
		"smg_grpc_servicer-1.0.dist-info/entry_points.txt": "[sglang.srt.plugins]\nsmg = smg_grpc_servicer:register\n",
	})
	conf := filepath.Join(t.TempDir(), "engine.yaml")
	if err := os.WriteFile(conf, []byte("api-key: \"sekrit\"\nenable-metrics: true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProc(t, py, []string{"-m", sglangModule, "--model-path", t.TempDir(), "--served-model-name", "m", "--host", "127.0.0.1", "--port", "0",
		"--config", conf, "--enable-memory-saver", "--tokenizer-worker-num", "1"}, "SGLANG_PLUGINS=capyctl-loads-no-plugins")
	p.waitListening(t)
	p.waitFor(t, "ready", func() bool { s, _ := p.get("/v1/models", "Authorization", "Bearer sekrit"); return s == 200 })
	if s, _ := p.get("/v1/models"); s != 401 {
		t.Fatalf("the key from --config is not required: %d", s)
	}
	if s, body := p.get("/metrics"); s != 200 || !strings.Contains(body, "sglang:num_running_reqs") {
		t.Fatalf("metrics from --config: %d", s)
	}
	if !strings.Contains(p.stdout.String(), "selects no installed plugin") {
		t.Fatalf("plugin selection not logged:\n%s", p.stdout)
	}
	pid := p.cmd.Process.Pid
	shm := fmt.Sprintf("/dev/shm/sglang_loads_%d.shm", pid)
	if _, err := os.Stat(shm); err != nil {
		t.Fatalf("no shared-memory segment: %v", err)
	}
	var sched int
	p.waitFor(t, "the scheduler child", func() bool { sched = childNamed(pid, "sglang::schedul"); return sched != 0 })
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if _, err := os.Stat(shm); !os.IsNotExist(err) {
		t.Fatalf("segment left after a clean exit: %v", err)
	}
}

func TestSGLangInvocation_SchedulerDies(t *testing.T) {
	py := fakeVenv(t, "sglang", "0.5.22", nil)
	p := startProc(t, py, []string{"-m", sglangModule, "--model-path", t.TempDir(), "--host", "127.0.0.1", "--port", "0"},
		"CAPYCTL_FAKE_SCHEDULER_EXIT_DURING_STARTUP=3")
	p.waitListening(t)
	pid := p.cmd.Process.Pid
	shm := fmt.Sprintf("/dev/shm/sglang_loads_%d.shm", pid)
	t.Cleanup(func() { os.Remove(shm) })
	p.waitFor(t, "the scheduler's death", func() bool { return strings.Contains(p.stderr.String(), "Scheduler hit an exception") })
	p.waitFor(t, "the collector's errors", func() bool { return strings.Contains(p.stderr.String(), "FileNotFoundError") })
	if _, err := http.Get(p.url + "/health"); err == nil {
		t.Fatal("the server answers though it never loaded")
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.wait(t)
	if _, err := os.Stat(shm); err != nil {
		t.Fatalf("a launch that never served must leave its segment, as SGLang does: %v", err)
	}
}

// childNamed returns a child of pid whose comm starts with prefix, 0 if none.
func childNamed(pid int, prefix string) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		c, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c))
		if err != nil {
			continue
		}
		s := string(stat)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 || f[1] != strconv.Itoa(pid) {
			continue
		}
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", c))
		if strings.HasPrefix(strings.TrimSpace(string(comm)), prefix) {
			return c
		}
	}
	return 0
}
