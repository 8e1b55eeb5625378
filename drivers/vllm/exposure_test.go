// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package vllm

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/capyctl/capyctl/drivers/internal/drivertest"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/engineapi"
	"github.com/capyctl/capyctl/sdk/enginekit"
	"github.com/capyctl/capyctl/sdk/proc"
)

// The test binary is also the launch shim of the engines it starts.
func TestMain(m *testing.M) {
	proc.MaybeRunShim()
	os.Exit(m.Run())
}

// fakeVenv is a venv whose bin/python is the testkit's fake engine and
// whose vllm distribution is version.
func fakeVenv(t *testing.T, root, version string) string {
	t.Helper()
	_, fake := harness.Binaries(t)
	venv := filepath.Join(root, "venv")
	sp := filepath.Join(venv, "lib", "python3.12", "site-packages", "vllm-"+version+".dist-info")
	if err := os.MkdirAll(sp, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(venv, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(fake, filepath.Join(venv, "bin", "python")); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"METADATA": "Metadata-Version: 2.1\nName: vllm\nVersion: " + version + "\n\n",
		"RECORD":   "vllm/__init__.py,sha256=fake,1\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(sp, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return venv
}

// TestStart_Exposure launches a vLLM that parks (development routes on)
// with a key, and plays another local user who knows the leased port but
// not the key and POSTs /sleep. From 0.11 vLLM serves on a Unix socket in
// the 0700 launch directory: the port refuses the foreign /sleep, and the
// driver serves, parks and wakes through the socket. An older vLLM would
// keep the port, where the foreign /sleep put the engine to sleep behind
// CapyCTL's back (what issue 13 reproduced): it is refused at Plan.
func TestStart_Exposure(t *testing.T) {
	cases := []struct {
		version string
		socket  bool
	}{
		{"0.31.0", true},
		{"0.10.2", false},
	}
	for _, c := range cases {
		t.Run(c.version, func(t *testing.T) {
			// A short root: sun_path holds 108 bytes.
			root, err := os.MkdirTemp("", "vx")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(root) })
			venv := fakeVenv(t, root, c.version)
			_, llama := drivertest.WriteModels(t, root, "")
			d := New()
			ctx := context.Background()
			det, err := d.Detect(ctx, &sdk.DetectRequest{Path: venv})
			if err != nil {
				t.Fatal(err)
			}
			inst := &sdk.Installation{Name: "vllm", Family: Family, Path: venv, Version: det.Version, Digest: det.Digest}
			dep := &sdk.Deployment{Name: "chat", API: "chat", ServedName: "chat", ModelDir: llama, Residency: enginekit.ResidencyHostBacked}
			port := drivertest.FreePort(t)
			lctx := &sdk.LaunchContext{Port: int32(port), LaunchDir: filepath.Join(root, "launches", "chat", "0-L1"), InstanceID: "chat/0", LaunchID: "L1"}
			host := &sdk.HostPolicy{EngineLogs: "file"}
			plan, err := d.Plan(ctx, &sdk.PlanRequest{Installation: *inst, Deployment: *dep, Host: drivertest.Value(host), Launch: *lctx})
			if err != nil {
				t.Fatal(err)
			}
			if !c.socket {
				// L11: a vLLM without --uds would serve on a port every
				// local user reaches (its /sleep answered a foreign
				// request): it is refused, not started.
				if rs := plan.Refusals; len(rs) != 1 || rs[0].Code != "engine_unsupported:no_socket" {
					t.Fatalf("plan of vLLM %s: %v, want one refusal engine_unsupported:no_socket", c.version, rs)
				}
				return
			}
			if len(plan.Refusals) > 0 {
				t.Fatalf("plan: %v", plan.Refusals)
			}
			const key = "the-launch-key"
			if _, err := d.Start(ctx, &sdk.StartRequest{Installation: *inst, Deployment: *dep, Host: drivertest.Value(host), Launch: *lctx, Plan: *plan, EngineKey: key}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_, _ = d.Stop(ctx, &sdk.StopRequest{InstanceID: "chat/0", Grace: 5 * time.Second})
			})
			ready, err := d.Probe(ctx, &sdk.ProbeRequest{InstanceID: "chat/0", Kind: sdk.ProbeKindReadiness, Deadline: 60 * time.Second})
			if err != nil || !ready.Ready {
				t.Fatalf("readiness: %v %v", ready, err)
			}
			ep := &ready.Endpoint

			// Another local user: the leased port, no key.
			foreign := &http.Client{Timeout: 10 * time.Second}
			sleep, err := foreign.Post(fmt.Sprintf("http://127.0.0.1:%d/sleep?level=1", port), "application/json", nil)
			if sleep != nil {
				io.Copy(io.Discard, sleep.Body)
				sleep.Body.Close()
			}
			if !c.socket {
				if err != nil || sleep.StatusCode != http.StatusOK {
					t.Fatalf("the foreign /sleep on TCP: %v %v (want it answered: that is the exposure)", sleep, err)
				}
				if ep.Listener != enginekit.ListenerTCP || !slices.Contains(ep.OpenRoutes, sleepPath) {
					t.Fatalf("endpoint %v does not report /sleep open to local users", ep)
				}
				return
			}
			if err == nil {
				t.Fatalf("the foreign /sleep reached the engine over TCP: %d", sleep.StatusCode)
			}
			sock, ok := engineapi.UnixSocket(ep.BaseURL)
			if !ok || ep.Listener != enginekit.ListenerUnix || filepath.Dir(sock) != lctx.LaunchDir {
				t.Fatalf("endpoint %v: want the socket in %s", ep, lctx.LaunchDir)
			}
			if fi, err := os.Stat(lctx.LaunchDir); err != nil || fi.Mode().Perm() != 0o700 {
				t.Fatalf("launch directory: %v %v", fi, err)
			}
			// The driver parks and wakes through the socket; the router's
			// requests go there too.
			if _, err := d.Park(ctx, &sdk.ParkRequest{InstanceID: "chat/0"}); err != nil {
				t.Fatalf("park: %v", err)
			}
			if _, err := d.Wake(ctx, &sdk.WakeRequest{InstanceID: "chat/0"}); err != nil {
				t.Fatalf("wake: %v", err)
			}
			cl := engineapi.NewEngineClient(ep.BaseURL, ep.AuthHeader, ep.AuthValue)
			answer, err := engineapi.ChatProbe(ctx, cl, ep.ChatPath, ep.ServedName, "Hello", 8)
			if err != nil || answer == "" {
				t.Fatalf("chat through the socket: %q %v", answer, err)
			}
		})
	}
}
