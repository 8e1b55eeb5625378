// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package scripts_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestRelease_Refusals: what a release must not be is refused before
// anything is built, with the remedy in the message.
func TestRelease_Refusals(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("releases are for Linux")
	}
	changelog := filepath.Join(t.TempDir(), "CHANGELOG.md")
	if err := os.WriteFile(changelog, []byte(testChangelog), 0o600); err != nil {
		t.Fatal(err)
	}
	other := map[string]string{"amd64": "arm64", "arm64": "amd64"}[runtime.GOARCH]
	otherCC := map[string]string{"amd64": "x86_64-linux-gnu-gcc", "arm64": "aarch64-linux-gnu-gcc"}[other]
	cases := []struct {
		name    string
		version string
		env     []string
		want    string
		skip    string
	}{
		{name: "a version that is not semantic", version: "0.2", want: "is not MAJOR.MINOR.PATCH"},
		{name: "a version without a changelog section", version: "9.9.9", want: `has no "## 9.9.9" section`},
		{name: "a target this machine cannot build with cgo", version: testVersion, env: []string{"RELEASE_TARGETS=linux/" + other},
			want: "sees no NVIDIA GPU", skip: otherCC},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.skip != "" {
				if _, err := exec.LookPath(c.skip); err == nil {
					t.Skipf("%s is installed: this machine builds the target with cgo", c.skip)
				}
			}
			out := filepath.Join(t.TempDir(), "dist")
			cmd := exec.Command("bash", "release.sh", c.version, testCommit)
			cmd.Env = append(os.Environ(), append([]string{"RELEASE_DIR=" + out, "RELEASE_CHANGELOG=" + changelog}, c.env...)...)
			b, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("release.sh %s succeeded:\n%s", c.version, b)
			}
			if !strings.Contains(string(b), c.want) {
				t.Fatalf("%q not in:\n%s", c.want, b)
			}
			if _, err := os.Stat(out); err == nil {
				t.Fatalf("a refused release left %s behind", out)
			}
		})
	}
	t.Run("a pre-release without a section of its own takes Unreleased", func(t *testing.T) {
		// Only the notes are checked: the refusal comes first, so the
		// build is cut short by a target that does not exist.
		cmd := exec.Command("bash", "release.sh", "9.9.9-rc.1", testCommit)
		cmd.Env = append(os.Environ(), "RELEASE_DIR="+filepath.Join(t.TempDir(), "dist"), "RELEASE_CHANGELOG="+changelog, "RELEASE_TARGETS=plan9/mips")
		b, _ := cmd.CombinedOutput()
		if strings.Contains(string(b), "section") {
			t.Fatalf("a pre-release was refused for its notes:\n%s", b)
		}
	})
}

// TestChangelog_Cut: changelog.sh cut moves Unreleased's entries under the
// version's heading, leaves an empty Unreleased above it, and refuses a
// version it has, or nothing to release.
func TestChangelog_Cut(t *testing.T) {
	file := filepath.Join(t.TempDir(), "CHANGELOG.md")
	if err := os.WriteFile(file, []byte(testChangelog), 0o600); err != nil {
		t.Fatal(err)
	}
	cut := func(version string) (string, error) {
		cmd := exec.Command("bash", "changelog.sh", "cut", version, "2027-02-01")
		cmd.Env = append(os.Environ(), "RELEASE_CHANGELOG="+file)
		b, err := cmd.CombinedOutput()
		return string(b), err
	}
	if out, err := cut("9.8.8"); err != nil {
		t.Fatalf("cut 9.8.8: %v\n%s", err, out)
	}
	got, _ := os.ReadFile(file)
	want := strings.Replace(testChangelog, "## Unreleased\n", "## Unreleased\n\n## 9.8.8 (2027-02-01)\n", 1)
	if string(got) != want {
		t.Fatalf("after the cut:\n%s\nwant:\n%s", got, want)
	}
	for _, c := range []struct{ version, want string }{
		{"9.8.7", `has a "## 9.8.7" section already`},
		{"9.8.9", "lists nothing to release"},
	} {
		if out, err := cut(c.version); err == nil || !strings.Contains(out, c.want) {
			t.Fatalf("cut %s: %v, want %q:\n%s", c.version, err, c.want, out)
		}
	}
}

// TestInstall_FromLocalReleaseRunsDev is the first hour from the release:
// the archive make release builds, installed by install.sh from the local
// release directory (no network) into a temporary prefix, runs
// `capyctl dev` with nothing but the installed capyctl on PATH; the demo
// answers a request, and Ctrl-C leaves no process of the installed binary
// and no state directory behind.
func TestInstall_FromLocalReleaseRunsDev(t *testing.T) {
	dir := release(t)
	home, prefix, tmp := t.TempDir(), t.TempDir(), t.TempDir()
	// No curl or wget: the install must not reach for the network.
	path := hostTools(t, "sh", "tar", "gzip", "sha256sum", "awk", "find", "head", "mktemp", "cp", "mv", "rm", "mkdir", "chmod", "sed", "uname", "tr", "cut", "basename", "id", "pwd", "cat")
	cmd := exec.Command("sh", "install.sh", "--from", dir, "--prefix", prefix, "--no-units")
	cmd.Env = []string{"PATH=" + path, "HOME=" + home}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("install --from: %v\n%s", err, out)
	}
	bin := filepath.Join(prefix, "bin", "capyctl")
	entries, err := os.ReadDir(filepath.Dir(bin))
	if err != nil || len(entries) != 1 {
		t.Fatalf("the prefix's bin holds %v (%v), want capyctl alone", entries, err)
	}

	dev := exec.Command(bin, "dev", "--json", "--listen", "127.0.0.1:0")
	dev.Env = []string{"PATH=" + filepath.Dir(bin) + ":" + path, "HOME=" + home, "TMPDIR=" + tmp}
	dev.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stderr lockedBuffer
	dev.Stderr = &stderr
	stdout, err := dev.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := dev.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		// What a failed run left: the role, its drivers, its engines.
		_ = syscall.Kill(-dev.Process.Pid, syscall.SIGKILL)
		for _, pid := range runningFrom(prefix) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		_ = dev.Wait()
		t.Fatalf("capyctl dev from the install printed nothing: %v\n%s", err, stderr.String())
	}
	var info map[string]string
	if err := json.Unmarshal([]byte(line), &info); err != nil || info["endpoint"] == "" || info["state_dir"] == "" {
		t.Fatalf("dev --json: %q %v", line, err)
	}
	if !strings.HasPrefix(info["state_dir"], tmp+"/") {
		t.Fatalf("dev's state %s is not a temporary directory under %s", info["state_dir"], tmp)
	}
	for _, model := range []string{"demo", "chat-a"} {
		body := `{"model":"` + model + `","stream":true,"messages":[{"role":"user","content":"Hello"}]}`
		req, _ := http.NewRequest(http.MethodPost, info["endpoint"]+"/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+info["api_key"])
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.HasSuffix(strings.TrimSpace(string(b)), "data: [DONE]") || resp.Header.Get("X-CapyCTL-Request-Id") == "" {
			t.Fatalf("%s from the installed dev: %d %s\n%s", model, resp.StatusCode, b, stderr.String())
		}
	}
	// The engines are the installed capyctl itself (capyctl fake-engine).
	if n := len(runningFrom(prefix)); n < 4 {
		t.Fatalf("%d processes run the installed capyctl; want the role, two drivers and the engines", n)
	}
	if err := dev.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- dev.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("dev after Ctrl-C: %v\n%s", err, stderr.String())
		}
	case <-time.After(3 * time.Minute):
		t.Fatalf("dev did not stop within 3 minutes of Ctrl-C\n%s", stderr.String())
	}
	if left := runningFrom(prefix); len(left) != 0 {
		var what []string
		for _, pid := range left {
			what = append(what, describeProcess(pid))
		}
		t.Fatalf("processes of the installed capyctl left after Ctrl-C:\n%s\n%s", strings.Join(what, "\n"), stderr.String())
	}
	if _, err := os.Stat(info["state_dir"]); !os.IsNotExist(err) {
		t.Fatalf("the temporary state directory is left after Ctrl-C: %v", err)
	}
}

// hostTools makes a directory of links to the named programs only, for a
// PATH that holds nothing else (no curl, no go, no bin/ of a build).
func hostTools(t *testing.T, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, n := range names {
		p, err := exec.LookPath(n)
		if err != nil {
			t.Skipf("%s is not installed", n)
		}
		if err := os.Symlink(p, filepath.Join(dir, n)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// runningFrom lists the live processes whose program lies under dir.
func runningFrom(dir string) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, err := os.Readlink("/proc/" + e.Name() + "/exe")
		if err != nil || !strings.HasPrefix(exe, dir+"/") {
			continue
		}
		if st, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil {
			if i := strings.LastIndexByte(string(st), ')'); i > 0 && i+2 < len(st) && st[i+2] == 'Z' {
				continue // a zombie holds nothing
			}
		}
		out = append(out, pid)
	}
	return out
}

// describeProcess says what a process is: its command line, state and
// parent (read from /proc), for a failure's message.
func describeProcess(pid int) string {
	p := "/proc/" + strconv.Itoa(pid)
	cmdline, _ := os.ReadFile(p + "/cmdline")
	status, _ := os.ReadFile(p + "/status")
	var state, ppid string
	for _, l := range strings.Split(string(status), "\n") {
		switch {
		case strings.HasPrefix(l, "State:"):
			state = strings.TrimSpace(strings.TrimPrefix(l, "State:"))
		case strings.HasPrefix(l, "PPid:"):
			ppid = strings.TrimSpace(strings.TrimPrefix(l, "PPid:"))
		}
	}
	return fmt.Sprintf("pid %d (parent %s, %s): %s", pid, ppid, state, strings.ReplaceAll(strings.TrimRight(string(cmdline), "\x00"), "\x00", " "))
}

// lockedBuffer is a buffer a process writes while a test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
