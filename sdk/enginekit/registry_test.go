// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package enginekit

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/proc"
)

// self is a launch whose engine is this test process: alive, and never
// signalled by these tests.
func self(t *testing.T) *sdk.Launch {
	t.Helper()
	ticks, err := proc.ReadStartTicks(os.Getpid())
	if err != nil {
		t.Skipf("no process table: %v", err)
	}
	return &sdk.Launch{LaunchDir: t.TempDir(), Port: 4242, LaunchID: "l1",
		Processes: []*sdk.ProcessIdentity{{Pid: int32(os.Getpid()), StartTicks: ticks, Role: "engine"}}}
}

// gone is a launch whose processes do not exist.
func gone(t *testing.T) *sdk.Launch {
	return &sdk.Launch{Pgid: 999999, LaunchDir: t.TempDir(),
		Processes: []*sdk.ProcessIdentity{{Pid: 999999, StartTicks: 1, Role: "engine"}}}
}

func TestRegistry_Recover(t *testing.T) {
	attach := func(l proc.Launched, detail string) (*Instance, string, error) {
		return NewInstance("d/0", "l1", l, 4242, NewEndpoint(4242, "d", "k")), detail + "; attached", nil
	}
	refuse := func(proc.Launched, string) (*Instance, string, error) {
		return nil, "", errors.New("cannot tell")
	}
	cases := []struct {
		name   string
		kept   *sdk.Launch
		launch *sdk.Launch
		attach AttachFunc[*Instance]
		state  sdk.RecoverState
		detail string
		keeps  bool
	}{
		{name: "no launch", attach: attach, state: sdk.RecoverStateGone, detail: "no launch recorded"},
		{name: "a launch that is gone", launch: gone(t), attach: attach, state: sdk.RecoverStateGone, detail: "the engine process is gone"},
		{name: "a running launch", launch: self(t), attach: attach, state: sdk.RecoverStateRunning,
			detail: "re-attached from the recorded launch; attached", keeps: true},
		{name: "a running launch the driver cannot tell", launch: self(t), attach: refuse, state: sdk.RecoverStateUncertain, detail: "cannot tell"},
		{name: "a kept handle", kept: self(t), attach: refuse, state: sdk.RecoverStateRunning, detail: "handle kept by this driver", keeps: true},
		{name: "a kept handle that is gone", kept: gone(t), launch: self(t), attach: attach, state: sdk.RecoverStateGone, detail: "the engine process is gone"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := NewRegistry[*Instance]()
			if c.kept != nil {
				r.Put(NewInstance("d/0", "l1", FromLaunch(c.kept), 4242, NewEndpoint(4242, "d", "k")))
			}
			req := &sdk.RecoverRequest{InstanceID: "d/0"}
			if c.launch != nil {
				req.Launch = *c.launch
			}
			resp, err := r.Recover(req, c.attach)
			if err != nil || resp.State != c.state || resp.Detail != c.detail {
				t.Fatalf("recover %+v %v, want %v %q", resp, err, c.state, c.detail)
			}
			if c.state == sdk.RecoverStateRunning &&
				(resp.Endpoint.AuthValue != "Bearer k" || resp.Launch.LaunchID != "l1" || resp.Launch.Port != 4242) {
				t.Fatalf("recover %+v", resp)
			}
			if _, err := r.Get("d/0"); (err == nil) != c.keeps {
				t.Fatalf("kept %v, want %v", err == nil, c.keeps)
			}
		})
	}
}

func TestRegistry_StopAndLogs(t *testing.T) {
	r := NewRegistry[*Instance]()
	if _, err := r.Stop(&sdk.StopRequest{InstanceID: "d/0"}, DefaultStopGrace, StopHooks{}); sdk.CodeOf(err) != sdk.CodeInstanceNotFound {
		t.Fatalf("stop without a handle or a launch: %v", err)
	}
	if _, err := r.Logs(&sdk.LogsRequest{InstanceID: "d/0"}); sdk.CodeOf(err) != sdk.CodeInstanceNotFound {
		t.Fatalf("logs without a handle or a directory: %v", err)
	}
	l := gone(t)
	r.Put(NewInstance("d/0", "l1", FromLaunch(l), 4242, NewEndpoint(4242, "d", "")))
	var before, after []string
	hooks := StopHooks{
		Before: func(l proc.Launched) { before = append(before, l.LaunchDir) },
		Gone: func(l proc.Launched, resp *sdk.StopResponse) {
			after = append(after, l.LaunchDir)
			resp.Cleaned = []string{"x"}
		},
	}
	resp, err := r.Stop(&sdk.StopRequest{InstanceID: "d/0", Grace: 10 * time.Millisecond}, DefaultStopGrace, hooks)
	if err != nil || !resp.Gone || len(resp.Cleaned) != 1 || len(before) != 1 || len(after) != 1 || before[0] != l.LaunchDir {
		t.Fatalf("stop %+v %v (hooks %v %v)", resp, err, before, after)
	}
	if _, err := r.Get("d/0"); err == nil {
		t.Fatal("a stopped instance is still kept")
	}
	// Without a handle, the recorded launch is stopped.
	if resp, err := r.Stop(&sdk.StopRequest{InstanceID: "d/0", Launch: gone(t)}, DefaultStopGrace, StopHooks{}); err != nil || !resp.Gone {
		t.Fatalf("stop a recorded launch %+v %v", resp, err)
	}
	if resp, err := r.Logs(&sdk.LogsRequest{InstanceID: "d/0", LaunchDir: t.TempDir()}); err != nil || resp.Text != "" {
		t.Fatalf("logs of an empty directory %+v %v", resp, err)
	}
}

func TestNewEndpoint(t *testing.T) {
	ep := NewEndpoint(4242, "m", "k")
	if ep.BaseURL != "http://127.0.0.1:4242" || ep.ChatPath != ChatPath || ep.ServedName != "m" ||
		ep.AbortMode != sdk.AbortModeCloseConnection || ep.AuthHeader != "Authorization" || ep.AuthValue != "Bearer k" {
		t.Fatalf("endpoint %+v", ep)
	}
	if ep := NewEndpoint(4242, "m", ""); ep.AuthHeader != "" || ep.AuthValue != "" {
		t.Fatalf("an endpoint without a key %+v", ep)
	}
}

func TestEnv(t *testing.T) {
	host := &sdk.HostPolicy{HostEnv: map[string]string{"DO_NOT_TRACK": "0", "X": "1"}}
	e := NewEnv("/bin")
	e.PinDevices(&sdk.LaunchContext{DeviceUUIDs: []string{"GPU-a", "GPU-b"}})
	e.NoTelemetry(host)
	e.Merge(host.HostEnv)
	want := map[string]string{"PATH": "/bin", "LANG": "C.UTF-8", "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b", "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "DO_NOT_TRACK": "0", "X": "1"}
	if len(e) != len(want) {
		t.Fatalf("env %v", e)
	}
	for k, v := range want {
		if e[k] != v {
			t.Errorf("%s=%q, want %q (a later step wins)", k, e[k], v)
		}
	}
	e = NewEnv("/bin")
	e.NoTelemetry(&sdk.HostPolicy{EngineTelemetry: "allow"})
	e.PinDevices(&sdk.LaunchContext{})
	if _, ok := e["DO_NOT_TRACK"]; ok || len(e) != 2 {
		t.Fatalf("telemetry allowed, no devices: %v", e)
	}
}

// TestFileDigest_FollowsTheFile: a digest kept for a file's version is never
// given for another version.
func TestFileDigest_FollowsTheFile(t *testing.T) {
	old := racyWindow
	racyWindow = -time.Hour // keep every digest, even of a file just written
	t.Cleanup(func() { racyWindow = old })
	p := filepath.Join(t.TempDir(), "engine")
	if err := os.WriteFile(p, []byte("version one"), 0o755); err != nil {
		t.Fatal(err)
	}
	d1, err := FileDigest(p)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := FileDigest(p); again != d1 {
		t.Fatalf("the same file has two digests: %s, %s", d1, again)
	}
	if n := cachedDigests(); n == 0 {
		t.Fatal("the digest was not kept")
	}
	if err := os.WriteFile(p, []byte("version 2, longer"), 0o755); err != nil {
		t.Fatal(err)
	}
	d2, err := FileDigest(p)
	if err != nil {
		t.Fatal(err)
	}
	if d2 == d1 {
		t.Fatal("the rewritten file kept its old digest")
	}
	sum := sha256.Sum256([]byte("version 2, longer"))
	if d2 != "sha256:"+hex.EncodeToString(sum[:]) {
		t.Fatalf("digest %s", d2)
	}
}

func cachedDigests() int {
	n := 0
	digests.Range(func(any, any) bool { n++; return true })
	return n
}

func TestLogMode(t *testing.T) {
	cases := []struct {
		host *sdk.HostPolicy
		want string
	}{
		{&sdk.HostPolicy{}, proc.LogModeFile},
		{&sdk.HostPolicy{EngineLogs: "file", Retention: "standard"}, proc.LogModeFile},
		{&sdk.HostPolicy{EngineLogs: "memory"}, proc.LogModeMemory},
		{&sdk.HostPolicy{Retention: "zero"}, proc.LogModeMemory},
	}
	for _, c := range cases {
		if got := LogMode(c.host); got != c.want {
			t.Errorf("LogMode(%v) = %s, want %s", c.host, got, c.want)
		}
	}
}
