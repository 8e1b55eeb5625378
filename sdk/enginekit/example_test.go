// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package enginekit_test

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/enginekit"
)

// An engine on its leased loopback port, with the per-launch key as a
// bearer token: what Start hands the router.
func ExampleNewEndpoint() {
	ep := enginekit.NewEndpoint(8123, "demo", "k3y")
	fmt.Println(ep.BaseURL, ep.ChatPath, ep.ServedName)
	fmt.Println(ep.AuthHeader+":", ep.AuthValue)
	fmt.Println(ep.AbortMode)
	// Output:
	// http://127.0.0.1:8123 /v1/chat/completions demo
	// Authorization: Bearer k3y
	// ABORT_MODE_CLOSE_CONNECTION
}

// An engine's environment as Plan renders it: a closed PATH, the launch's
// cards, no telemetry unless the host allows it, then the host's and the
// deployment's variables (a later step wins).
func ExampleEnv() {
	host := &sdk.HostPolicy{HostEnv: map[string]string{"HF_HOME": "/srv/hf"}}
	env := enginekit.NewEnv(enginekit.SystemPath)
	env.PinDevices(&sdk.LaunchContext{DeviceUUIDs: []string{"GPU-0"}})
	env.NoTelemetry(host)
	env.Merge(host.HostEnv)
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Printf("%s=%s\n", k, env[k])
	}
	// Output:
	// CUDA_DEVICE_ORDER=PCI_BUS_ID
	// CUDA_VISIBLE_DEVICES=GPU-0
	// DO_NOT_TRACK=1
	// HF_HOME=/srv/hf
	// LANG=C.UTF-8
	// PATH=/usr/local/bin:/usr/bin:/bin
}

// Plan refuses what a deployment may not do with a catalogue code, the
// field at fault and a message the operator can act on.
func ExampleRefusals() {
	var r enginekit.Refusals
	r.Add(enginekit.CodeCapabilityMissing+":deep_park", "residency", "hello engines do not park: set residency = %q", enginekit.ResidencyRestartOnly)
	resp := &sdk.PlanResponse{Refusals: r}
	for _, x := range resp.Refusals {
		fmt.Println(x.Code, x.Field, x.Message)
	}
	// Output:
	// capability_missing:deep_park residency hello engines do not park: set residency = "restart_only"
}

// A restarted driver asked to recover an instance whose launch the core
// never recorded reports it gone; the attach function is called only for
// an engine that still runs.
func ExampleRegistry_Recover() {
	reg := enginekit.NewRegistry[*enginekit.Instance]()
	resp, _ := reg.Recover(&sdk.RecoverRequest{InstanceID: "demo/0"}, nil)
	fmt.Println(resp.State, "-", resp.Detail)
	// Output:
	// RECOVER_STATE_GONE - no launch recorded
}

// An engine served on a Unix socket in its launch directory (0700) is out
// of reach of other local users; one on a TCP port says which routes
// answer without the key.
func ExampleExposure_Apply() {
	tcp := enginekit.Exposure{OpenRoutes: []string{"/metrics"}, Note: "the engine has no socket option"}.
		Apply(enginekit.NewEndpoint(8123, "demo", "k3y"))
	fmt.Println(tcp.Listener, tcp.BaseURL, tcp.OpenRoutes)
	unix := enginekit.Exposure{Socket: "/run/capyctl/launches/7/engine.sock"}.
		Apply(enginekit.NewEndpoint(8123, "demo", "k3y"))
	fmt.Println(unix.Listener, unix.BaseURL)
	// Output:
	// tcp http://127.0.0.1:8123 [/metrics]
	// unix http+unix://%2Frun%2Fcapyctl%2Flaunches%2F7%2Fengine.sock
}

// FileDigest pins a program: Detect reports it, Start refuses a program
// whose digest changed since.
func ExampleFileDigest() {
	dir, _ := os.MkdirTemp("", "enginekit-example")
	defer os.RemoveAll(dir)
	p := filepath.Join(dir, "engine")
	_ = os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755)
	d, _ := enginekit.FileDigest(p)
	fmt.Println(d)
	// Output:
	// sha256:a8076d3d28d21e02012b20eaf7dbf75409a6277134439025f282e368e3305abf
}

// The idle signal: nothing running or waiting, and known.
func ExampleIdle() {
	fmt.Println(enginekit.Idle(&sdk.LoadResponse{Known: true}))
	fmt.Println(enginekit.Idle(&sdk.LoadResponse{Known: true, Running: 1}))
	fmt.Println(enginekit.Idle(&sdk.LoadResponse{Known: false}))
	// Output:
	// true
	// false
	// false
}
