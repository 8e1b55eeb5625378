// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/api/client"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// Role is a capyctl role running as a subprocess.
type Role struct {
	t        testing.TB
	Bin      string
	FakeBin  string
	StateDir string
	// Args are the extra arguments the role was started with.
	Args []string
	Env  []string
	// RoleName is standalone, server or host.
	RoleName string
	// ClusterAddr is a server's cluster listener; a restart binds the same
	// one, as a server with a configured port does.
	ClusterAddr string

	cmd    *exec.Cmd
	out    *bytes.Buffer
	ports  string
	waitCh chan error

	Info  *client.RunInfo
	Creds *client.Credentials
	Mgmt  *client.Client
}

// Options configure StartStandalone.
type Options struct {
	// Bin is the capyctl binary to run (default: Binaries'), for a
	// benchmark that runs two builds side by side.
	Bin string
	// StateDir reuses a state directory (a restart); default a fresh one.
	StateDir string
	// Args are extra `start standalone` arguments.
	Args []string
	// Env are extra environment variables of the role.
	Env []string
	// Role is the role to start: standalone (the default), server or host
	// (StartServer and StartHost set it).
	Role string
}

// StartStandalone starts `capyctl start standalone` on loopback ports and
// waits until its management API answers. The role, its drivers and its
// engines are cleaned up when the test ends.
func StartStandalone(t testing.TB, opts Options) *Role {
	t.Helper()
	bin, fake := Binaries(t)
	dir := opts.StateDir
	if dir == "" {
		dir = t.TempDir()
	}
	role := opts.Role
	if role == "" {
		role = "standalone"
	}
	if opts.Bin != "" {
		bin = opts.Bin
	}
	r := &Role{t: t, Bin: bin, FakeBin: fake, StateDir: dir, Args: opts.Args, Env: opts.Env, RoleName: role}
	r.start()
	t.Cleanup(func() { r.cleanup() })
	return r
}

func (r *Role) start() {
	r.t.Helper()
	_ = os.Remove(filepath.Join(r.StateDir, client.RunInfoFile))
	r.Mgmt, r.Info = nil, nil // a restart's role listens on new ports
	if r.ports == "" {
		// Roles of parallel tests lease engine ports from ranges picked at
		// random below Linux's ephemeral ports (32768 and up), so that no
		// client connection or ":0" listener of another test takes a port
		// between its lease and the engine's bind.
		base := 10000 + rand.IntN(220)*100
		r.ports = fmt.Sprintf("%d-%d", base, base+99)
	}
	args := r.startArgs()
	cmd := exec.Command(r.Bin, args...)
	cmd.Env = append(baseEnv(), r.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	r.out = &bytes.Buffer{}
	cmd.Stdout = &lockedWriter{w: r.out}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		r.t.Fatalf("start role: %v", err)
	}
	r.cmd = cmd
	r.waitCh = make(chan error, 1)
	go func() { r.waitCh <- cmd.Wait() }()
	deadline := time.Now().Add(60 * time.Second)
	// The role writes its run information and serves before it prints its
	// banner: once the API answers, wait for the "role started" line that
	// follows the banner, so that Output() holds it (unless the role was
	// told to log above info, when the line never comes).
	waitBanner := !r.raisedLogLevel()
	for {
		if r.Mgmt == nil {
			ri, err := client.ReadRunInfo(r.StateDir)
			if err == nil && ri.PID == cmd.Process.Pid {
				c, info, derr := client.Discover(r.StateDir)
				if derr == nil {
					if _, err := c.Engines(context.Background()); err == nil {
						r.Mgmt, r.Info = c, info
						r.Creds, _ = client.ReadCredentials(r.StateDir)
					}
				}
			}
		}
		if r.Mgmt != nil && (!waitBanner || strings.Contains(r.Output(), "role started")) {
			return
		}
		select {
		case err := <-r.waitCh:
			r.waitCh <- err
			r.t.Fatalf("role exited while starting: %v\n%s", err, r.Output())
		default:
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("role did not come up within 60s\n%s", r.Output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startArgs are the role's `capyctl start` arguments: loopback
// listeners, its state directory, its ports, then r.Args.
func (r *Role) startArgs() []string {
	args := []string{"start", r.RoleName, "--state-dir", r.StateDir, "--listen", "127.0.0.1:0", "--management-listen", "127.0.0.1:0"}
	if r.RoleName == "server" {
		addr := r.ClusterAddr
		if addr == "" {
			addr = "127.0.0.1:0"
		}
		args = append(args, "--cluster-listen", addr)
	} else {
		engine := r.ports
		var first, last int
		if _, err := fmt.Sscanf(r.ports, "%d-%d", &first, &last); err == nil && r.RoleName == "host" && last-first >= 56 {
			// A group head's rendezvous port comes from the role's own
			// range too, not from the shared default (25000-25099), which
			// other tests' ports may hold: room for four heads of seven
			// ports each (lifecycle.RendezvousSpan).
			engine = fmt.Sprintf("%d-%d", first, last-28)
			args = append(args, "--rendezvous-ports", fmt.Sprintf("%d-%d", last-27, last))
		}
		args = append(args, "--engine-ports", engine, "--models-root", filepath.Join(r.StateDir, "models"))
	}
	args = append(args, r.Args...)
	return args
}

// raisedLogLevel reports whether the role's arguments or environment set
// its log level (which may hide the info-level "role started" line).
func (r *Role) raisedLogLevel() bool {
	for _, a := range append(append([]string{}, r.Args...), r.Env...) {
		if strings.Contains(strings.ToLower(a), "log-level") || strings.Contains(strings.ToLower(a), "log_level") {
			return true
		}
	}
	return false
}

// baseEnv is a small environment for subprocesses.
func baseEnv() []string {
	return []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "TMPDIR=" + os.TempDir()}
}

// Output returns what the role printed so far.
func (r *Role) Output() string {
	if lw, ok := r.cmd.Stdout.(*lockedWriter); ok {
		return lw.String()
	}
	return ""
}

// PID returns the role's process ID.
func (r *Role) PID() int { return r.cmd.Process.Pid }

// Kill9 kills the role with SIGKILL (a crash) and waits for it.
func (r *Role) Kill9() {
	r.t.Helper()
	_ = r.cmd.Process.Kill()
	<-r.waitCh
	r.waitCh <- nil
}

// Stop sends SIGTERM and waits for the role to exit.
func (r *Role) Stop() {
	r.t.Helper()
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-r.waitCh:
		r.waitCh <- err
	case <-time.After(90 * time.Second):
		r.t.Fatalf("role did not exit within 90s of SIGTERM\n%s", r.Output())
	}
}

// Restart starts the role again on the same state directory (after Stop or
// Kill9).
func (r *Role) Restart() {
	r.t.Helper()
	r.start()
}

// Exited reports whether the role process has exited.
func (r *Role) Exited() bool {
	select {
	case err := <-r.waitCh:
		r.waitCh <- err
		return true
	default:
		return false
	}
}

// cleanup stops everything the role started, by stopping its deployments
// and then killing whatever remains under its state directory.
func (r *Role) cleanup() {
	if !r.Exited() && r.Mgmt != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if list, err := r.Mgmt.Deployments(ctx); err == nil {
			for _, d := range list {
				_, _ = r.Mgmt.Action(ctx, d.Name, actionStop())
			}
		}
		cancel()
		_ = r.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-r.waitCh:
		case <-time.After(30 * time.Second):
			_ = r.cmd.Process.Kill()
		}
	}
	KillLeftovers(r.StateDir)
}

// CLI runs a capyctl command against this role and returns its output and
// exit code.
func (r *Role) CLI(args ...string) (stdout, stderr string, code int) {
	r.t.Helper()
	return RunCLI(r.t, r.Bin, append([]string{}, append(args, "--state-dir", r.StateDir)...), nil)
}

// RunCLI runs the capyctl binary.
func RunCLI(t testing.TB, bin string, args []string, env []string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(baseEnv(), env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code := 0
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("run capyctl %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	return o.String(), e.String(), code
}

// InferenceURL returns the inference base URL.
func (r *Role) InferenceURL() string { return "http://" + r.Info.Inference }

// Chat sends a chat request with the role's API key (key "" uses it; pass
// a key to test others).
func (r *Role) Chat(ctx context.Context, body string, headers map[string]string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.InferenceURL()+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if _, ok := headers["Authorization"]; !ok {
		req.Header.Set("Authorization", "Bearer "+r.Creds.APIKey)
	}
	for k, v := range headers {
		if v == "" {
			req.Header.Del(k)
			continue
		}
		req.Header.Set(k, v)
	}
	return http.DefaultClient.Do(req)
}

// ChatBody returns a chat request body.
func ChatBody(model string, stream bool, content string) string {
	b, _ := json.Marshal(map[string]any{
		"model": model, "stream": stream, "max_tokens": 8,
		"messages": []map[string]string{{"role": "user", "content": content}},
	})
	return string(b)
}

// ReadAll reads and closes a response body.
func ReadAll(resp *http.Response) string {
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// WriteFile writes a file under the role's state directory and returns its
// path.
func (r *Role) WriteFile(name, content string) string {
	r.t.Helper()
	p := filepath.Join(r.StateDir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		r.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		r.t.Fatal(err)
	}
	return p
}

// Eventually polls cond until it is true or the timeout passes, backing
// off up to every 200 ms (poll.UntilSlow): conditions on a role cost a
// request or a CLI process.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	poll.UntilSlow(t, timeout, what, cond)
}

// Atoi parses an int or fails the test.
func Atoi(t testing.TB, s string) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		t.Fatalf("not a number %q", s)
	}
	return n
}

var _ = fmt.Sprintf
