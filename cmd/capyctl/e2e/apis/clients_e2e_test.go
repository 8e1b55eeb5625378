// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package apis_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/plugins-testkit/testbin"
)

// TestClients_Official runs the official OpenAI and Anthropic Node clients
// (plugins-testkit/clients/node, versions pinned by its package-lock.json)
// against `capyctl dev`: the Responses API (create, previous_response_id,
// retrieve, delete, streamed events, a function call round trip) and the
// Messages API (create, stream, a tool round trip, countTokens, an unknown
// model's 404), each on a model whose engine serves the API (the fake
// vLLM) and on one the router translates to chat (a custom engine).
//
// The packages are installed with `npm ci` into the user's cache directory
// (keyed by the lock file's digest, so a second run installs nothing), never
// into the source tree. Without node or npm the test skips and says so; CI
// installs them (.ci/run).
func TestClients_Official(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a role and the Node clients")
	}
	node, errNode := exec.LookPath("node")
	npm, errNpm := exec.LookPath("npm")
	if errNode != nil || errNpm != nil {
		t.Skipf("the official clients test needs node and npm on PATH (node: %v, npm: %v); .ci/run installs Debian's nodejs and npm", errNode, errNpm)
	}
	dir := installClients(t, npm)
	bin, _ := harness.Binaries(t)

	cmd := exec.Command(bin, "dev", "--json", "--listen", "127.0.0.1:0")
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
	stopped := false
	defer func() {
		if !stopped {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		harness.KillLeftovers(tmp)
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		_ = cmd.Wait()
		stopped = true
		t.Fatalf("dev --json printed nothing: %v\n%s", err, stderr.String())
	}
	var info map[string]string
	if err := json.Unmarshal([]byte(line), &info); err != nil || info["endpoint"] == "" || info["api_key"] == "" {
		t.Fatalf("dev --json: %q %v", line, err)
	}
	native, _, _ := strings.Cut(info["switch_models"], ",")
	if native == "" {
		t.Fatalf("dev --json names no fake vLLM model: %q", line)
	}

	// Two named keys for the rate-limit checks: generous limits scoped to
	// the native model, and one request a minute.
	limited := createKey(t, bin, info["state_dir"], "node-limited", "--models", native, "--rpm", "1000", "--tpm", "100000")
	tight := createKey(t, bin, info["state_dir"], "node-tight", "--rpm", "1")

	script := filepath.Join(dir, "clients-"+strings.ReplaceAll(t.Name(), "/", "_")+".test.mjs")
	src, err := os.ReadFile(filepath.Join(clientsSource(t), "clients.test.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(script, src, 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(script)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	run := exec.CommandContext(ctx, node, script)
	run.Dir = dir
	run.Env = append(os.Environ(),
		"CAPYCTL_ENDPOINT="+info["endpoint"], "CAPYCTL_API_KEY="+info["api_key"],
		"CAPYCTL_TRANSLATED_MODEL="+info["model"], "CAPYCTL_NATIVE_MODEL="+native,
		"CAPYCTL_LIMITED_KEY="+limited, "CAPYCTL_TIGHT_KEY="+tight)
	out, err := run.CombinedOutput()
	t.Logf("node %s:\n%s", filepath.Base(script), out)
	if err != nil {
		t.Fatalf("the official clients failed: %v\n(the role's log:)\n%s", err, lastBytes(stderr.String(), 4000))
	}
	if !strings.Contains(string(out), "all checks passed") {
		t.Fatal("the script ended without its last line")
	}

	// Ctrl-C stops the role and leaves nothing behind.
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
		stopped = true
	case <-time.After(2 * time.Minute):
		t.Fatal("capyctl dev did not stop on SIGINT")
	}
}

// createKey makes a named key with the CLI (capyctl create api-key NAME
// ... --json) and returns it.
func createKey(t *testing.T, bin, stateDir, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(bin, append([]string{"create", "api-key", name, "--json", "--state-dir", stateDir}, args...)...).Output()
	var created map[string]string
	if err != nil || json.Unmarshal(out, &created) != nil || created["key"] == "" {
		t.Fatalf("create api-key %s: %v %s", name, err, out)
	}
	return created["key"]
}

// clientsSource is the clients' directory in the source tree.
func clientsSource(t *testing.T) string {
	t.Helper()
	root, err := testbin.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "plugins-testkit", "clients", "node")
}

// installClients installs the pinned clients (npm ci) into a cache
// directory named by the lock file's digest and returns it. Concurrent
// runs (other worktrees, other packages) install into directories of
// their own and rename the first complete one into place.
func installClients(t *testing.T, npm string) string {
	t.Helper()
	src := clientsSource(t)
	lock, err := os.ReadFile(filepath.Join(src, "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	pkg, err := os.ReadFile(filepath.Join(src, "package.json"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(append(append([]byte(nil), pkg...), lock...))
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "capyctl", "node-clients", hex.EncodeToString(sum[:8]))
	if _, err := os.Stat(filepath.Join(dir, "node_modules", ".package-lock.json")); err == nil {
		return dir
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	work, err := os.MkdirTemp(filepath.Dir(dir), "install-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(work)
	for name, b := range map[string][]byte{"package.json": pkg, "package-lock.json": lock} {
		if err := os.WriteFile(filepath.Join(work, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts")
	cmd.Dir = work
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci (the pinned official clients; the npm registry must be reachable once): %v\n%s", err, out)
	}
	if err := os.Rename(work, dir); err != nil {
		if _, statErr := os.Stat(filepath.Join(dir, "node_modules", ".package-lock.json")); statErr != nil {
			t.Fatalf("install the clients into %s: %v", dir, err)
		}
	}
	return dir
}

// lastBytes is the end of s, at most n bytes.
func lastBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}
