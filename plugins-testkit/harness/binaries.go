// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package harness runs whole CapyCTL roles in tests: the real capyctl
// binary as a subprocess, with a private state directory, the testkit's
// fake engines registered through the same paths an operator uses, and
// helpers to call the CLI, the management API and the inference API, and to
// kill and restart processes. It is the one testkit package that may import
// core (for the API client and wire types).
package harness

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
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, out), pkg)
		cmd.Dir = root
		if b, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
		}
	}
	return dir, nil
}

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
