// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package scripts_test

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// readmeBlock is one fenced block of README.md.
type readmeBlock struct {
	section string // the "## " heading it is under
	lang    string
	code    string
	line    int
}

// readmeBlocks reads README.md's fenced blocks.
func readmeBlocks(t *testing.T) (blocks []readmeBlock, text string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	section := ""
	var cur *readmeBlock
	for i, line := range strings.Split(string(data), "\n") {
		switch {
		case cur == nil && strings.HasPrefix(line, "## "):
			section = strings.TrimPrefix(line, "## ")
		case cur == nil && strings.HasPrefix(line, "```"):
			cur = &readmeBlock{section: section, lang: strings.Fields(strings.TrimPrefix(line, "```") + " x")[0], line: i + 1}
		case cur != nil && strings.HasPrefix(line, "```"):
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.code += line + "\n"
		}
	}
	return blocks, string(data)
}

// TestReadme_Commands runs README.md's command blocks (```sh), in order,
// as a newcomer would on this machine: from the install of the release (a
// release of this tree, built by release.sh and served on loopback) to the
// tour of capyctl dev, to a role running a vLLM deployment. Each "## "
// section is one terminal (one bash, so an export or a KEY= holds for the
// blocks after it); a block that is one `capyctl dev` or `capyctl start`
// runs in a terminal of its own, in the background, until the test's
// Ctrl-C. What the machine provides the prose names (a vLLM environment in
// ~/venvs/vllm, a model in ~/models/qwen3-4b, a GPU): the testkit's fake
// vLLM, a model directory, and the simulated GPU
// (CAPYCTL_GPU_PROVIDER=simulated). The substitutions, and only these: the
// releases URL is the loopback server's; the roles listen on free ports
// (capyctl dev --listen 127.0.0.1:0, CAPYCTL_LISTEN and
// CAPYCTL_MANAGEMENT_LISTEN for the role), and 127.0.0.1:8443 in a block is
// the address of its section's role; /tmp/capyctl-tour is a directory of
// the test. The outcomes the prose promises are checked after the blocks.
// The make targets the README names exist (they are not run: `make test`
// is what runs this test).
func TestReadme_Commands(t *testing.T) {
	blocks, text := readmeBlocks(t)
	for _, target := range regexp.MustCompile("`make ([a-z][a-z-]*)").FindAllStringSubmatch(text, -1) {
		out, err := exec.Command("make", "-C", "..", "-n", target[1]).CombinedOutput()
		if err != nil {
			t.Errorf("README names make %s, which does not run: %v\n%s", target[1], err, out)
		}
	}
	var runnable []readmeBlock
	for _, b := range blocks {
		switch b.lang {
		case "sh":
			runnable = append(runnable, b)
		case "text":
		default:
			t.Fatalf("README.md:%d: a %q block: use sh (run by this test) or text (output)", b.line, b.lang)
		}
	}
	if len(runnable) < 8 {
		t.Fatalf("README has %d sh blocks; expected the install, the tour and the real run", len(runnable))
	}

	dir := release(t)
	base := serve(t, dir, nil)
	home, tmp, tour := t.TempDir(), t.TempDir(), t.TempDir()
	tools := hostTools(t, "sh", "bash", "curl", "tar", "gzip", "sha256sum", "awk", "find", "head", "mktemp", "cp", "mv", "rm",
		"mkdir", "chmod", "sed", "uname", "tr", "cut", "basename", "id", "pwd", "cat", "dirname", "sleep", "env", "grep")
	bin := filepath.Join(home, ".local", "bin")
	env := []string{"HOME=" + home, "PATH=" + bin + ":" + tools, "TMPDIR=" + tmp, "LANG=C.UTF-8",
		"CAPYCTL_RELEASE_URL=" + base, "CAPYCTL_GPU_PROVIDER=simulated",
		"CAPYCTL_LISTEN=127.0.0.1:0", "CAPYCTL_MANAGEMENT_LISTEN=127.0.0.1:0"}
	rewrite := func(code string) string {
		return strings.NewReplacer("https://github.com/capyctl/capyctl/releases", base, "/tmp/capyctl-tour", tour).Replace(code)
	}

	var roles []*readmeRole
	t.Cleanup(func() {
		for _, r := range roles {
			r.kill()
		}
		for _, pid := range runningFrom(bin) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	var sh *readmeShell
	var role *readmeRole
	section := ""
	for _, b := range runnable {
		if b.section != section {
			section, role = b.section, nil
			if sh != nil {
				sh.close()
			}
			sh = newShell(t, env)
		}
		code := rewrite(b.code)
		if cmd, ok := foregroundRole(code); ok {
			role = startReadmeRole(t, cmd, env, home, tour)
			roles = append(roles, role)
			continue
		}
		if role != nil {
			code = strings.ReplaceAll(code, "127.0.0.1:8443", role.inference)
		}
		if strings.Contains(code, "capyctl engine add ~/venvs/vllm") {
			readmeMachine(t, home, bin)
		}
		out := sh.run(t, b, code)
		t.Logf("README.md:%d ran:\n%s", b.line, out)
		checkReadmeOutcome(t, b, code, out, role, bin)
	}
	if sh != nil {
		sh.close()
	}
	// Ctrl-C: each role stops and leaves no process of the installed
	// capyctl (the real run's deployment is stopped first: a role's own
	// stop never stops an engine, as a restart must not).
	for i := len(roles) - 1; i >= 0; i-- {
		r := roles[i]
		if !r.dev {
			if out, err := r.cli("stop", "deployment", "chat-small", "--wait"); err != nil {
				t.Errorf("stop chat-small: %v\n%s", err, out)
			}
		}
		r.interrupt(t)
	}
	poll.Until(t, 30*time.Second, "no process of the installed capyctl left", func() bool { return len(runningFrom(bin)) == 0 })
}

// foregroundRole reports a block that is one command running a role in the
// foreground (capyctl dev, capyctl start <role>).
func foregroundRole(code string) (string, bool) {
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(code), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 || !(strings.HasPrefix(lines[0], "capyctl dev") || strings.HasPrefix(lines[0], "capyctl start standalone")) {
		return "", false
	}
	return lines[0], true
}

// readmeMachine makes what the real run's prose says the machine has: a
// vLLM virtual environment in ~/venvs/vllm (the fake vLLM: its bin/python
// runs the installed capyctl as the engine) and a Qwen3-shaped model in
// ~/models/qwen3-4b.
func readmeMachine(t *testing.T, home, bin string) {
	t.Helper()
	venv := filepath.Join(home, "venvs", "vllm")
	site := filepath.Join(venv, "lib", "python3.12", "site-packages", "vllm-0.32.0.dist-info")
	model := filepath.Join(home, "models", "qwen3-4b")
	for _, d := range []string{filepath.Join(venv, "bin"), site, model} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{
		filepath.Join(venv, "bin", "python"): "#!/bin/bash\nCAPYCTL_FAKE_ENGINE=1 exec -a \"$0\" " + filepath.Join(bin, "capyctl") + " \"$@\"\n",
		filepath.Join(site, "METADATA"):      "Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0\n\n",
		filepath.Join(site, "RECORD"):        "vllm/__init__.py,sha256=fake,1\n",
		filepath.Join(model, "config.json"): `{"model_type":"qwen3","architectures":["Qwen3ForCausalLM"],"num_hidden_layers":36,"num_attention_heads":32,` +
			`"num_key_value_heads":8,"hidden_size":2560,"head_dim":128,"torch_dtype":"bfloat16","max_position_embeddings":40960}`,
		filepath.Join(model, "tokenizer_config.json"): `{"chat_template":"{% for m in messages %}{{ m.content }}{% endfor %}"}`,
	}
	for p, body := range files {
		mode := os.FileMode(0o644)
		if strings.HasSuffix(p, "python") {
			mode = 0o755
		}
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
	}
}

// checkReadmeOutcome checks what the prose around a block promises.
func checkReadmeOutcome(t *testing.T, b readmeBlock, code, out string, role *readmeRole, bin string) {
	t.Helper()
	state := func(name string) string {
		t.Helper()
		o, err := role.cli("status", "deployment", name, "--json")
		var st struct {
			State string `json:"state"`
		}
		if err != nil || json.Unmarshal([]byte(o), &st) != nil {
			t.Fatalf("README.md:%d: status of %s: %v\n%s", b.line, name, err, o)
		}
		return st.State
	}
	switch {
	case strings.Contains(code, "install.sh | sh"):
		if _, err := os.Stat(filepath.Join(bin, "capyctl")); err != nil || !strings.Contains(out, "capyctl "+testVersion) {
			t.Fatalf("README.md:%d: the install did not put capyctl %s on PATH:\n%s", b.line, testVersion, out)
		}
	case strings.Contains(code, `"stream":true`):
		if !strings.Contains(out, "data: [DONE]") || !strings.Contains(out, ": x-capyctl-metrics ") {
			t.Fatalf("README.md:%d: the streamed answer lacks its figures or [DONE]:\n%s", b.line, out)
		}
	case strings.Contains(code, "/v1/models"):
		for _, m := range []string{`"id":"demo"`, `"id":"chat-a"`, `"id":"chat-b"`} {
			if !strings.Contains(out, m) {
				t.Fatalf("README.md:%d: the model list lacks %s:\n%s", b.line, m, out)
			}
		}
	case strings.Contains(code, "/v1/responses") && strings.Contains(code, "/v1/messages"):
		if !strings.Contains(out, `"object":"response"`) || !strings.Contains(out, `"type":"message"`) {
			t.Fatalf("README.md:%d: no Responses and Messages answers:\n%s", b.line, out)
		}
	case strings.Contains(code, "for m in chat-a chat-b chat-a"):
		if got := strings.Count(out, `"object":"chat.completion"`); got != 3 {
			t.Fatalf("README.md:%d: %d answers of 3:\n%s", b.line, got, out)
		}
		// "CapyCTL wakes the one you name and parks the other to make
		// room, and demo keeps serving": parking chat-b frees enough.
		for name, want := range map[string]string{"chat-a": "ready", "chat-b": "parked"} {
			if got := state(name); got != want {
				t.Errorf("README.md:%d: after the switches %s is %s, the README says %s", b.line, name, got, want)
			}
		}
		t.Run("demo keeps serving through the switches (victim choice, #26)", func(t *testing.T) {
			if got := state("demo"); got != "ready" {
				t.Errorf("README.md:%d: after the switches demo is %s: a switch stopped it although parking the other model alone frees enough", b.line, got)
			}
		})
	case strings.Contains(code, "capyctl start deployment demo --wait"):
		if !strings.Contains(out, "Deployment demo is ready") || state("demo") != "ready" {
			t.Fatalf("README.md:%d: demo did not start again:\n%s", b.line, out)
		}
	case strings.Contains(code, "vllm-minimal.hcl --activate --wait"):
		if !strings.Contains(out, "Deployment chat-small created (revision 1") || !strings.Contains(out, "Deployment chat-small unchanged (revision 1") ||
			!strings.Contains(out, `"model":"chat-small"`) {
			t.Fatalf("README.md:%d: the real run did not create, keep and answer chat-small:\n%s", b.line, out)
		}
	case strings.Contains(code, "help exit-codes"):
		if !strings.Contains(out, "Exit 29: ") || !strings.Contains(out, "deploy") {
			t.Fatalf("README.md:%d: help or exit codes incomplete:\n%s", b.line, out)
		}
	}
}

// readmeShell is a terminal: one bash that runs blocks one after another.
type readmeShell struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *lockedBuffer
	done chan struct{}
	n    int
}

func newShell(t *testing.T, env []string) *readmeShell {
	t.Helper()
	cmd := exec.Command("bash", "--noprofile", "--norc")
	cmd.Env = env
	cmd.Dir = t.TempDir()
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &readmeShell{cmd: cmd, in: in, out: out, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.done) }()
	fmt.Fprintln(in, "set -eo pipefail")
	return s
}

// run runs a block and returns what it printed; a command that fails ends
// the shell (set -e), and the test.
func (s *readmeShell) run(t *testing.T, b readmeBlock, code string) string {
	t.Helper()
	s.n++
	marker := fmt.Sprintf("__README_BLOCK_%d_DONE__", s.n)
	from := len(s.out.String())
	fmt.Fprintf(s.in, "%s\necho %s\n", code, marker)
	var out string
	poll.UntilSlow(t, 4*time.Minute, fmt.Sprintf("README.md:%d to run", b.line), func() bool {
		out = s.out.String()[from:]
		select {
		case <-s.done:
			t.Fatalf("README.md:%d failed (exit %d):\n--- block\n%s--- output\n%s", b.line, s.cmd.ProcessState.ExitCode(), b.code, out)
		default:
		}
		return strings.Contains(out, marker)
	})
	return strings.TrimSuffix(out[:strings.Index(out, marker)], "\n")
}

func (s *readmeShell) close() {
	_ = s.in.Close()
	<-s.done
}

// readmeRole is a role a block runs in the foreground of its own terminal.
type readmeRole struct {
	cmd       *exec.Cmd
	out       *lockedBuffer
	state     string
	inference string
	env       []string
	bin       string // the installed capyctl
	dev       bool
	done      chan struct{}
}

// startReadmeRole runs the block's role in the background and waits until
// it serves (its run information names its addresses).
func startReadmeRole(t *testing.T, line string, env []string, home, tour string) *readmeRole {
	t.Helper()
	r := &readmeRole{out: &lockedBuffer{}, env: env, bin: filepath.Join(home, ".local", "bin", "capyctl"), done: make(chan struct{}),
		dev: strings.HasPrefix(line, "capyctl dev")}
	if r.dev {
		line += " --listen 127.0.0.1:0"
		r.state = tour
	} else {
		r.state = filepath.Join(home, ".local", "state", "capyctl")
	}
	r.cmd = exec.Command("bash", "--noprofile", "--norc", "-c", "exec "+line)
	r.cmd.Env = env
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = r.cmd.Wait(); close(r.done) }()
	poll.UntilSlow(t, 3*time.Minute, line+" to serve", func() bool {
		select {
		case <-r.done:
			t.Fatalf("%s exited:\n%s", line, r.out.String())
		default:
		}
		data, err := os.ReadFile(filepath.Join(r.state, "run", "role.json"))
		var ri struct {
			PID       int    `json:"pid"`
			Inference string `json:"inference"`
		}
		if err != nil || json.Unmarshal(data, &ri) != nil || ri.PID != r.cmd.Process.Pid {
			return false
		}
		r.inference = ri.Inference
		// dev is ready once its banner is out (its models deployed).
		return !r.dev || strings.Contains(r.out.String(), "Press Ctrl-C")
	})
	return r
}

// cli runs the installed capyctl against the role.
func (r *readmeRole) cli(args ...string) (string, error) {
	cmd := exec.Command(r.bin, append(args, "--state-dir", r.state)...)
	cmd.Env = r.env
	out, err := cmd.Output()
	return string(out), err
}

// interrupt is Ctrl-C: the role stops and exits 0.
func (r *readmeRole) interrupt(t *testing.T) {
	t.Helper()
	_ = r.cmd.Process.Signal(os.Interrupt)
	select {
	case <-r.done:
		if code := r.cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("the role exited %d after Ctrl-C:\n%s", code, tail(r.out.String(), 30))
		}
	case <-time.After(3 * time.Minute):
		t.Errorf("the role did not stop within 3 minutes of Ctrl-C")
	}
}

func (r *readmeRole) kill() {
	select {
	case <-r.done:
	default:
		_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
		<-r.done
	}
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
