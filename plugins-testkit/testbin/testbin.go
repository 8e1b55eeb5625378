// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package testbin finds or builds the programs tests run: capyctl, the
// testkit's fake engine, and any other main package of this repository (a
// driver binary). It imports nothing of CapyCTL's core, so a third-party
// driver's tests may use it through the conformance suite.
package testbin

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// EnvBinDir names a directory holding prebuilt capyctl and
// capyctl-fake-engine binaries (make test sets it).
const EnvBinDir = "CAPYCTL_TEST_BIN_DIR"

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// Binaries returns the paths of the capyctl and capyctl-fake-engine
// binaries: from $CAPYCTL_TEST_BIN_DIR, or built once per test process
// into a shared cache directory (under a file lock, so parallel test
// packages build once).
func Binaries(t testing.TB) (capyctl, fake string) {
	t.Helper()
	buildOnce.Do(func() { binDir, buildErr = findOrBuild() })
	if buildErr != nil {
		t.Fatalf("test binaries: %v", buildErr)
	}
	return filepath.Join(binDir, "capyctl"), filepath.Join(binDir, "capyctl-fake-engine")
}

func findOrBuild() (string, error) {
	if d := os.Getenv(EnvBinDir); d != "" {
		for _, b := range []string{"capyctl", "capyctl-fake-engine"} {
			if _, err := os.Stat(filepath.Join(d, b)); err != nil {
				return "", fmt.Errorf("%s=%s lacks %s: run make build", EnvBinDir, d, b)
			}
		}
		return d, nil
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	// One cache per checkout: several worktrees build different code.
	sum := sha256.Sum256([]byte(root))
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("capyctl-testbin-%d-%s", os.Getuid(), hex.EncodeToString(sum[:6])))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", err
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) //nolint:errcheck
	for pkg, out := range map[string]string{
		"./cmd/capyctl": "capyctl",
		"./plugins-testkit/cmd/capyctl-fake-engine": "capyctl-fake-engine",
	} {
		if err := goBuild(root, pkg, filepath.Join(dir, out)); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// goBuild builds a main package of the module at root into out.
func goBuild(root, pkg, out string) error {
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
	}
	return nil
}

// Program returns the path of a program named name: $CAPYCTL_TEST_BIN_DIR/name
// when make build put it there, else pkg (a main package of this module,
// "./website/examples/driver") built once per test process into a
// temporary directory. Build a driver under the name its role looks for
// (capyctl-driver-<family>).
func Program(t testing.TB, name, pkg string) string {
	t.Helper()
	if d := os.Getenv(EnvBinDir); d != "" {
		if p := filepath.Join(d, name); fileExists(p) {
			return p
		}
	}
	programsMu.Lock()
	defer programsMu.Unlock()
	if p, ok := programs[name]; ok {
		return p
	}
	root, err := moduleRoot()
	if err != nil {
		t.Fatalf("build %s: %v", name, err)
	}
	dir, err := os.MkdirTemp("", "capyctl-testprog-")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := goBuild(root, pkg, p); err != nil {
		t.Fatalf("build %s: %v", name, err)
	}
	programs[name] = p
	return p
}

var (
	programsMu sync.Mutex
	// programs are the programs Program built in this process, by name.
	programs = map[string]string{}
)

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// ModuleRoot is the repository's root directory, found from this source
// file.
func ModuleRoot() (string, error) { return moduleRoot() }

// moduleRoot finds the repository root from this source file.
func moduleRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", fmt.Errorf("cannot locate the harness source")
	}
	dir := filepath.Dir(file)
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/capyctl/capyctl") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("go.mod of github.com/capyctl/capyctl not found above %s", file)
		}
		dir = parent
	}
}
