// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pluginmgr

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk"
)

// malformedFamily is the built-in family the test binary serves with
// malformedDriver.
const malformedFamily = "malformed"

// malformedDriver launches and describes itself well, then answers Detect
// without the digest and Start without the launch.
type malformedDriver struct{ testDriver }

func (malformedDriver) Detect(context.Context, *sdk.DetectRequest) (*sdk.DetectResponse, error) {
	return &sdk.DetectResponse{Family: malformedFamily, Version: "1"}, nil
}

func (malformedDriver) Start(context.Context, *sdk.StartRequest) (*sdk.StartResponse, error) {
	return &sdk.StartResponse{}, nil
}

// TestManager_DriverFaults: a driver that fails the handshake, speaks an
// unknown protocol, exits at launch, or answers a call with a malformed
// reply is reported with a code of the catalogue, the driver (family and
// program), the step or call, and what to do.
func TestManager_DriverFaults(t *testing.T) {
	r := newRig(t)
	plugins := filepath.Join(r.dir, "plugins")
	if err := os.MkdirAll(plugins, 0o755); err != nil {
		t.Fatal(err)
	}
	script := func(name, body string) {
		if err := os.WriteFile(filepath.Join(plugins, ExternalPrefix+name), []byte("#!/bin/sh\n"+body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	script("chatty", "echo 'hello from a program that is not a driver'\nexec sleep 60\n")
	script("future", "echo '1|7|unix|/nonexistent/driver.sock|grpc|'\nexec sleep 60\n")
	script("crashy", "echo 'panic: no configuration file' >&2\nexit 2\n")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	m := New(Config{
		Executable: exe, Builtins: []string{malformedFamily}, PluginDir: plugins,
		LogDir: filepath.Join(r.dir, "logs", "drivers"), SocketDir: r.socketDir(), Store: r.store,
		Env: []string{helperEnv + "=driver"},
	})
	t.Cleanup(func() { m.Shutdown(false) })

	detect := func(d sdk.Driver) error {
		_, err := d.Detect(context.Background(), &sdk.DetectRequest{Path: "/bin/true"})
		return err
	}
	start := func(d sdk.Driver) error {
		_, err := d.Start(context.Background(), &sdk.StartRequest{Launch: sdk.LaunchContext{LaunchID: "l1"}})
		return err
	}
	cases := []struct {
		name   string
		family string
		call   func(sdk.Driver) error // nil: the launch itself fails
		code   structs.Code
		says   []string
	}{
		{name: "handshake", family: "chatty", code: structs.CodeDriverHandshakeFailed,
			says: []string{`driver "chatty"`, ExternalPrefix + "chatty", "hello from a program that is not a driver", "sdk/plugin.Serve", "stdout"}},
		{name: "unknown protocol", family: "future", code: structs.CodeDriverProtocolUnsupported,
			says: []string{`driver "future"`, "protocol 7", "speaks protocol 1", "rebuild the driver"}},
		{name: "exits at launch", family: "crashy", code: structs.CodeDriverExitedAtStart,
			says: []string{`driver "crashy"`, "exited at launch", "panic: no configuration file", "run it by hand"}},
		{name: "malformed Detect", family: malformedFamily, call: detect, code: structs.CodeDriverReplyMalformed,
			says: []string{`driver "malformed"`, "answered Detect", "no digest", "plugins-testkit/conformance"}},
		{name: "malformed Start", family: malformedFamily, call: start, code: structs.CodeDriverReplyMalformed,
			says: []string{`driver "malformed"`, "answered Start", "no launch"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			d, err := m.Driver(ctx, c.family)
			if c.call != nil {
				if err != nil {
					t.Fatalf("launch: %v", err)
				}
				err = c.call(d)
			}
			e := structs.AsError(err)
			if err == nil || e.Code != c.code {
				t.Fatalf("error %v, want code %s", err, c.code)
			}
			if sdk.CodeOf(err) != "" && sdk.CodeOf(err) != string(c.code) {
				t.Fatalf("sdk code %q, want %s", sdk.CodeOf(err), c.code)
			}
			for _, s := range c.says {
				if !strings.Contains(e.Message, s) {
					t.Errorf("the message does not say %q:\n%s", s, e.Message)
				}
			}
		})
	}
}
