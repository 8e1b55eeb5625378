// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package drivers_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/enginekit"
	sdkplugin "github.com/capyctl/capyctl/sdk/plugin"
)

// brokenDriver is the name under which this test binary serves
// brokenStartDriver: a role runs it from its plugin directory.
const brokenDriver = "capyctl-driver-broken"

func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) == brokenDriver {
		sdkplugin.Serve(brokenStartDriver{})
	}
	os.Exit(m.Run())
}

// brokenStartDriver is a third-party driver that registers engines and
// plans well, then answers Start without the launch it made.
type brokenStartDriver struct{ sdk.UnimplementedDriver }

func (brokenStartDriver) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	return enginekit.Describe("broken", "0.1.0", &sdk.Capabilities{APIs: []string{"chat"}, AbortMode: sdk.AbortModeCloseConnection}, ""), nil
}

func (brokenStartDriver) Detect(_ context.Context, req *sdk.DetectRequest) (*sdk.DetectResponse, error) {
	d, err := enginekit.FileDigest(req.Path)
	return &sdk.DetectResponse{Family: "broken", Version: "1", Digest: d, Program: req.Path}, err
}

func (brokenStartDriver) Plan(_ context.Context, req *sdk.PlanRequest) (*sdk.PlanResponse, error) {
	return &sdk.PlanResponse{Argv: []string{req.Installation.Path}, Residency: enginekit.ResidencyRestartOnly}, nil
}

func (brokenStartDriver) Start(context.Context, *sdk.StartRequest) (*sdk.StartResponse, error) {
	return &sdk.StartResponse{}, nil
}

// TestDrivers_ThirdPartyFaultsAreExplained: capyctl engine add and capyctl
// status say which third-party driver failed, at which step or call, and
// what to do, with a code of the catalogue: a program that fails the
// plugin handshake, one that speaks an unknown protocol, one that exits at
// launch, and one that answers Start with a malformed reply.
func TestDrivers_ThirdPartyFaultsAreExplained(t *testing.T) {
	r := harness.StartStandalone(t, harness.Options{})
	plugins := filepath.Join(r.StateDir, "plugins")
	if err := os.MkdirAll(plugins, 0o700); err != nil {
		t.Fatal(err)
	}
	script := func(name, body string) {
		if err := os.WriteFile(filepath.Join(plugins, "capyctl-driver-"+name), []byte("#!/bin/sh\n"+body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	script("chatty", "echo 'hello, I print before serving'\nexec sleep 60\n")
	script("future", "echo '1|9|unix|/nonexistent/driver.sock|grpc|'\nexec sleep 60\n")
	script("crashy", "echo 'fatal: missing libengine.so' >&2\nexit 3\n")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(exe, filepath.Join(plugins, brokenDriver)); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		family string
		says   []string
	}{
		{"chatty", []string{"error [driver_handshake_failed]", `driver "chatty"`, "capyctl-driver-chatty", "hello, I print before serving", "sdk/plugin.Serve"}},
		{"future", []string{"error [driver_protocol_unsupported]", `driver "future"`, "protocol 9", "rebuild the driver"}},
		{"crashy", []string{"error [driver_exited_at_start]", `driver "crashy"`, "fatal: missing libengine.so", "run it by hand"}},
	} {
		t.Run(c.family, func(t *testing.T) {
			_, errOut, code := r.CLI("engine", "add", r.FakeBin, "--family", c.family, "--yes")
			if code != 13 {
				t.Fatalf("engine add: exit %d, want 13\n%s", code, errOut)
			}
			t.Logf("capyctl engine add:\n%s", errOut)
			for _, s := range c.says {
				if !strings.Contains(errOut, s) {
					t.Errorf("engine add does not say %q:\n%s", s, errOut)
				}
			}
		})
	}

	t.Run("malformed Start", func(t *testing.T) {
		if out, errOut, code := r.CLI("engine", "add", r.FakeBin, "--family", "broken", "--name", "broken", "--yes"); code != 0 {
			t.Fatalf("engine add: exit %d\n%s%s", code, out, errOut)
		}
		_, errOut, code := r.Deploy("b", harness.SimpleSpec("b", "broken"), "--activate", "--wait")
		if code == 0 || !strings.Contains(errOut, "driver_reply_malformed") {
			t.Fatalf("deploy on a driver whose Start is malformed: exit %d\n%s", code, errOut)
		}
		out, errOut, code := r.CLI("status")
		if code != 0 {
			t.Fatalf("status: exit %d\n%s", code, errOut)
		}
		t.Logf("capyctl status:\n%s", out)
		for _, s := range []string{"[driver_reply_malformed]", `driver "broken"`, brokenDriver, "answered Start", "no launch", "plugins-testkit/conformance"} {
			if !strings.Contains(out, s) {
				t.Errorf("status does not say %q:\n%s", s, out)
			}
		}
	})
}
