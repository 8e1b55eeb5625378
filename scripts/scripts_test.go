// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package scripts_test tests the release and install scripts: release.sh
// builds an archive with the version and commit embedded, a SHA256SUMS
// file and the version's notes from the changelog, and refuses what a
// release must not be; changelog.sh cuts a version's section; install.sh,
// served that release by a local file server or given it as a local
// directory, installs it for a user, system-wide or into a prefix and
// refuses an archive whose checksum does not match; and the installed
// capyctl runs `capyctl dev` with nothing else beside it.
package scripts_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

const (
	testVersion = "9.8.7"
	testCommit  = "abcdef123456"
)

// testChangelog has the test version's section between two others.
const testChangelog = `# Changelog

## Unreleased

- **Something to come.**

## 9.8.7 (2027-01-15)

### Features

- **The test release's feature.**

## 9.8.6 (2026-12-01)

- **An older one.**
`

var (
	releaseOnce sync.Once
	releaseDir  string
	releaseErr  error
	releaseLog  []byte
)

// release builds one release for this machine's architecture, once.
func release(t *testing.T) string {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("releases are for Linux")
	}
	for _, tool := range []string{"bash", "tar", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed", tool)
		}
	}
	releaseOnce.Do(func() {
		dir, err := os.MkdirTemp("", "capyctl-release-test-")
		if err != nil {
			releaseErr = err
			return
		}
		releaseDir = filepath.Join(dir, "dist")
		changelog := filepath.Join(dir, "CHANGELOG.md")
		if err := os.WriteFile(changelog, []byte(testChangelog), 0o600); err != nil {
			releaseErr = err
			return
		}
		cmd := exec.Command("bash", "release.sh", "v"+testVersion, testCommit)
		cmd.Env = append(os.Environ(), "RELEASE_DIR="+releaseDir, "RELEASE_TARGETS=linux/"+runtime.GOARCH, "RELEASE_CHANGELOG="+changelog)
		releaseLog, releaseErr = cmd.CombinedOutput()
	})
	if releaseErr != nil {
		t.Fatalf("release.sh: %v\n%s", releaseErr, releaseLog)
	}
	return releaseDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if releaseDir != "" {
		os.RemoveAll(filepath.Dir(releaseDir))
	}
	os.Exit(code)
}

func sha256File(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

func TestRelease_ArchiveSumsAndVersion(t *testing.T) {
	dir := release(t)
	archive := "capyctl-linux-" + runtime.GOARCH + ".tar.gz"
	sums, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{archive: sha256File(t, filepath.Join(dir, archive)), "install.sh": sha256File(t, filepath.Join(dir, "install.sh"))}
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(sums)), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			t.Fatalf("SHA256SUMS line %q", line)
		}
		got[f[1]] = f[0]
	}
	for name, sum := range want {
		if got[name] != sum {
			t.Errorf("SHA256SUMS says %s for %s, the file is %s", got[name], name, sum)
		}
	}

	x := t.TempDir()
	if out, err := exec.Command("tar", "-xzf", filepath.Join(dir, archive), "-C", x).CombinedOutput(); err != nil {
		t.Fatalf("tar: %v\n%s", err, out)
	}
	root := filepath.Join(x, "capyctl-"+testVersion+"-linux-"+runtime.GOARCH)
	for _, f := range []string{"capyctl", "LICENSE", "README.md", "CHANGELOG.md", "BUILD",
		"configs/systemd/system/capyctl-standalone.service", "configs/systemd/user/capyctl-standalone.service",
		"configs/jobs/vllm-minimal.hcl", "configs/roles/standalone.hcl"} {
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			t.Errorf("the archive lacks %s", f)
		}
	}
	out, err := exec.Command(filepath.Join(root, "capyctl"), "version", "--json").Output()
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]string
	if err := json.Unmarshal(out, &v); err != nil || v["version"] != testVersion || v["commit"] != testCommit {
		t.Fatalf("version of the released binary: %s", out)
	}
	build, _ := os.ReadFile(filepath.Join(root, "BUILD"))
	if !bytes.Contains(build, []byte("commit: "+testCommit)) || !bytes.Contains(build, []byte("nvml: yes")) {
		t.Fatalf("BUILD:\n%s", build)
	}
	notes, err := os.ReadFile(filepath.Join(dir, "RELEASE_NOTES.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := string(notes); !strings.HasPrefix(n, "# CapyCTL "+testVersion+"\n") || !strings.Contains(n, "The test release's feature") ||
		strings.Contains(n, "Something to come") || strings.Contains(n, "An older one") {
		t.Fatalf("RELEASE_NOTES.md is not the version's changelog section:\n%s", n)
	}
}

// serve serves a release directory the way GitHub lays releases out:
// <base>/download/<tag>/<file> and <base>/latest/download/<file>. files
// overrides a file's content.
func serve(t *testing.T, dir string, files map[string][]byte) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var name string
		switch {
		case strings.HasPrefix(r.URL.Path, "/releases/download/v"+testVersion+"/"):
			name = strings.TrimPrefix(r.URL.Path, "/releases/download/v"+testVersion+"/")
		case strings.HasPrefix(r.URL.Path, "/releases/latest/download/"):
			name = strings.TrimPrefix(r.URL.Path, "/releases/latest/download/")
		default:
			http.NotFound(w, r)
			return
		}
		if data, ok := files[name]; ok {
			_, _ = w.Write(data)
			return
		}
		http.ServeFile(w, r, filepath.Join(dir, filepath.Base(name)))
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/releases"
}

// install runs install.sh with a clean environment.
func install(t *testing.T, home string, env []string, args ...string) (string, error) {
	t.Helper()
	if _, err := exec.LookPath("curl"); err != nil {
		if _, err := exec.LookPath("wget"); err != nil {
			t.Skip("neither curl nor wget is installed")
		}
	}
	cmd := exec.Command("sh", append([]string{"install.sh"}, args...)...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + home}, env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestInstall(t *testing.T) {
	dir := release(t)
	archive := "capyctl-linux-" + runtime.GOARCH + ".tar.gz"

	t.Run("user install of a tag", func(t *testing.T) {
		home := t.TempDir()
		out, err := install(t, home, []string{"CAPYCTL_RELEASE_URL=" + serve(t, dir, nil)}, "--version", "v"+testVersion)
		if err != nil {
			t.Fatalf("install: %v\n%s", err, out)
		}
		bin := filepath.Join(home, ".local", "bin", "capyctl")
		v, err := exec.Command(bin, "version", "--json").Output()
		if err != nil || !strings.Contains(string(v), `"version":"`+testVersion+`"`) {
			t.Fatalf("installed capyctl: %s %v", v, err)
		}
		unit, err := os.ReadFile(filepath.Join(home, ".config", "systemd", "user", "capyctl-standalone.service"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(unit), "ExecStart="+bin+" start standalone") {
			t.Fatalf("the user unit does not run the installed binary:\n%s", unit)
		}
		if !strings.Contains(out, "checksum ok") {
			t.Fatalf("no checksum line:\n%s", out)
		}
		if _, err := os.Stat(filepath.Join(home, ".local", "share", "capyctl", "configs", "jobs", "vllm-minimal.hcl")); err != nil {
			t.Fatalf("the example job specs were not installed: %v\n%s", err, out)
		}
		if !strings.Contains(out, "systemctl --user daemon-reload") {
			t.Fatalf("the next steps omit daemon-reload:\n%s", out)
		}
	})

	t.Run("system install of the latest", func(t *testing.T) {
		root := t.TempDir()
		out, err := install(t, t.TempDir(), []string{"CAPYCTL_RELEASE_URL=" + serve(t, dir, nil), "CAPYCTL_INSTALL_ROOT=" + root}, "--system")
		if err != nil {
			t.Fatalf("install: %v\n%s", err, out)
		}
		if _, err := os.Stat(filepath.Join(root, "usr", "local", "bin", "capyctl")); err != nil {
			t.Fatal(err)
		}
		unit, err := os.ReadFile(filepath.Join(root, "etc", "systemd", "system", "capyctl-standalone.service"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(unit), "ExecStart=/usr/local/bin/capyctl start standalone") || !strings.Contains(string(unit), "User=capyctl") {
			t.Fatalf("system unit:\n%s", unit)
		}
	})

	refusals := []struct {
		name  string
		files map[string][]byte
		env   []string
		want  string
	}{
		{"a tampered archive", map[string][]byte{archive: []byte("not the archive SHA256SUMS describes")}, nil, "checksum mismatch"},
		{"a wrong sum", map[string][]byte{"SHA256SUMS": []byte(strings.Repeat("0", 64) + "  " + archive + "\n")}, nil, "checksum mismatch"},
		{"no sum for the archive", map[string][]byte{"SHA256SUMS": []byte(strings.Repeat("0", 64) + "  other.tar.gz\n")}, nil, "lists no " + archive},
		{"an unknown architecture", nil, []string{"CAPYCTL_ARCH=mips"}, "no release for the mips architecture"},
	}
	for _, c := range refusals {
		t.Run(c.name, func(t *testing.T) {
			home := t.TempDir()
			env := append([]string{"CAPYCTL_RELEASE_URL=" + serve(t, dir, c.files)}, c.env...)
			out, err := install(t, home, env, "--version", testVersion)
			if err == nil {
				t.Fatalf("install succeeded:\n%s", out)
			}
			if !strings.Contains(out, c.want) {
				t.Fatalf("%q not in:\n%s", c.want, out)
			}
			if _, err := os.Stat(filepath.Join(home, ".local", "bin", "capyctl")); err == nil {
				t.Fatalf("capyctl was installed despite the refusal")
			}
		})
	}
}

// TestRelease_ATagWantsTheSDKTag: a release built from its tag needs the SDK
// module's tag (sdk/vX.Y.Z) on the same commit, since driver authors
// require the SDK by it; without it nothing is built and the refusal gives
// the command that makes it. The script runs in a repository of its own
// that holds only itself, so the real one's tags are never touched.
func TestRelease_ATagWantsTheSDKTag(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	repo := t.TempDir()
	script, err := os.ReadFile("release.sh")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(repo, "scripts"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(repo, "scripts", "release.sh"), script, 0o755); err != nil {
		t.Fatal(err)
	}
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.com"}, args...)...)
		cmd.Dir = repo
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	git("init", "-q")
	git("add", ".")
	git("commit", "-q", "-m", "release script")
	git("tag", "-a", "v"+testVersion, "-m", "CapyCTL "+testVersion)
	run := func() string {
		cmd := exec.Command("bash", "scripts/release.sh", "", testCommit)
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "RELEASE_DIR="+filepath.Join(repo, "dist"), "RELEASE_CHANGELOG="+filepath.Join(repo, "none.md"))
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Fatalf("release.sh built a release from a repository with no changelog:\n%s", out)
		}
		return string(out)
	}
	want := "git tag -a sdk/v" + testVersion
	if out := run(); !strings.Contains(out, want) {
		t.Fatalf("without the SDK's tag, release.sh said:\n%s\nwant a refusal that gives %q", out, want)
	}
	git("tag", "-a", "sdk/v"+testVersion, "-m", "CapyCTL SDK "+testVersion)
	if out := run(); strings.Contains(out, "sdk/v") {
		t.Fatalf("with the SDK's tag on HEAD, release.sh still asked for it:\n%s", out)
	}
}
