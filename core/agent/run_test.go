// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/capyctl/capyctl/core/config"
	"github.com/capyctl/capyctl/core/runinfo"
)

// testSettings are a standalone role's settings on loopback ports, a
// simulated GPU and a state directory of the test's own.
func testSettings(t *testing.T) Settings {
	t.Helper()
	dir := t.TempDir()
	cfg, err := config.Load(config.LoadOptions{Env: []string{"HOME=" + dir}, Flags: map[string]string{
		"role": "standalone", "state_dir": dir, "listen": "127.0.0.1:0", "management_listen": "127.0.0.1:0",
		"gpu.provider": "simulated", "models_root": filepath.Join(dir, "models"),
	}})
	if err != nil {
		t.Fatal(err)
	}
	return SettingsFromConfig(cfg)
}

// TestRun_ServesAndStops: Run starts a role that serves both listeners with
// its credentials (written owner-only), calls Ready once, and returns when
// its context ends, leaving no run-info behind.
func TestRun_ServesAndStops(t *testing.T) {
	s := testSettings(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan Running, 1)
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{Settings: s, Logger: hclog.NewNullLogger(), Ready: func(_ context.Context, r Running) error {
			ready <- r
			return nil
		}})
	}()
	var r Running
	select {
	case r = <-ready:
	case err := <-done:
		t.Fatalf("Run ended before it was ready: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("not ready")
	}
	fi, err := os.Stat(filepath.Join(s.StateDir, runinfo.CredentialsFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("credentials file: %v, %v", fi, err)
	}
	get := func(url, token string) int {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	cases := []struct {
		name, url, token string
		status           int
	}{
		{"models with the key", "http://" + r.InferenceAddr() + "/v1/models", r.APIKey(), 200},
		{"models without it", "http://" + r.InferenceAddr() + "/v1/models", "", 401},
		{"management with the admin token", "http://" + r.ManagementAddr() + "/management/v1/snapshot", r.AdminToken(), 200},
		{"management with the API key", "http://" + r.ManagementAddr() + "/management/v1/snapshot", r.APIKey(), 401},
	}
	for _, c := range cases {
		if got := get(c.url, c.token); got != c.status {
			t.Errorf("%s: %d, want %d", c.name, got, c.status)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if _, err := os.Stat(filepath.Join(s.StateDir, runinfo.RunInfoFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("run info left behind: %v", err)
	}
}

// TestRun_ReadyErrorStopsTheRole: an error from Ready stops the role and is
// Run's answer.
func TestRun_ReadyErrorStopsTheRole(t *testing.T) {
	boom := errors.New("the command could not set the role up")
	err := Run(context.Background(), Options{Settings: testSettings(t), Logger: hclog.NewNullLogger(),
		Ready: func(context.Context, Running) error { return boom }})
	if !errors.Is(err, boom) {
		t.Fatalf("Run = %v, want the Ready error", err)
	}
}
