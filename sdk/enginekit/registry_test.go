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
	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
)

// self is a launch whose engine is this test process: alive, and never
// signalled by these tests.
func self(t *testing.T) *pb.Launch {
	t.Helper()
	ticks, err := proc.ReadStartTicks(os.Getpid())
	if err != nil {
		t.Skipf("no process table: %v", err)
	}
	return &pb.Launch{LaunchDir: t.TempDir(), Port: 4242, LaunchId: "l1",
		Processes: []*pb.ProcessIdentity{{Pid: int32(os.Getpid()), StartTicks: ticks, Role: "engine"}}}
}

// gone is a launch whose processes do not exist.
func gone(t *testing.T) *pb.Launch {
	return &pb.Launch{Pgid: 999999, LaunchDir: t.TempDir(),
		Processes: []*pb.ProcessIdentity{{Pid: 999999, StartTicks: 1, Role: "engine"}}}
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
		kept   *pb.Launch
		launch *pb.Launch
		attach AttachFunc[*Instance]
		state  pb.RecoverState
		detail string
		keeps  bool
	}{
		{name: "no launch", attach: attach, state: pb.RecoverState_RECOVER_STATE_GONE, detail: "no launch recorded"},
		{name: "a launch that is gone", launch: gone(t), attach: attach, state: pb.RecoverState_RECOVER_STATE_GONE, detail: "the engine process is gone"},
		{name: "a running launch", launch: self(t), attach: attach, state: pb.RecoverState_RECOVER_STATE_RUNNING,
			detail: "re-attached from the recorded launch; attached", keeps: true},
		{name: "a running launch the driver cannot tell", launch: self(t), attach: refuse, state: pb.RecoverState_RECOVER_STATE_UNCERTAIN, detail: "cannot tell"},
		{name: "a kept handle", kept: self(t), attach: refuse, state: pb.RecoverState_RECOVER_STATE_RUNNING, detail: "handle kept by this driver", keeps: true},
		{name: "a kept handle that is gone", kept: gone(t), launch: self(t), attach: attach, state: pb.RecoverState_RECOVER_STATE_GONE, detail: "the engine process is gone"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := NewRegistry[*Instance]()
			if c.kept != nil {
				r.Put(NewInstance("d/0", "l1", FromLaunch(c.kept), 4242, NewEndpoint(4242, "d", "k")))
			}
			resp, err := r.Recover(&pb.RecoverRequest{InstanceId: "d/0", Launch: c.launch}, c.attach)
			if err != nil || resp.GetState() != c.state || resp.GetDetail() != c.detail {
				t.Fatalf("recover %+v %v, want %v %q", resp, err, c.state, c.detail)
			}
			if c.state == pb.RecoverState_RECOVER_STATE_RUNNING &&
				(resp.GetEndpoint().GetAuthValue() != "Bearer k" || resp.GetLaunch().GetLaunchId() != "l1" || resp.GetLaunch().GetPort() != 4242) {
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
	if _, err := r.Stop(&pb.StopRequest{InstanceId: "d/0"}, DefaultStopGrace, StopHooks{}); sdk.CodeOf(err) != sdk.CodeInstanceNotFound {
		t.Fatalf("stop without a handle or a launch: %v", err)
	}
	if _, err := r.Logs(&pb.LogsRequest{InstanceId: "d/0"}); sdk.CodeOf(err) != sdk.CodeInstanceNotFound {
		t.Fatalf("logs without a handle or a directory: %v", err)
	}
	l := gone(t)
	r.Put(NewInstance("d/0", "l1", FromLaunch(l), 4242, NewEndpoint(4242, "d", "")))
	var before, after []string
	hooks := StopHooks{
		Before: func(l proc.Launched) { before = append(before, l.LaunchDir) },
		Gone: func(l proc.Launched, resp *pb.StopResponse) {
			after = append(after, l.LaunchDir)
			resp.Cleaned = []string{"x"}
		},
	}
	resp, err := r.Stop(&pb.StopRequest{InstanceId: "d/0", GraceMs: 10}, DefaultStopGrace, hooks)
	if err != nil || !resp.GetGone() || len(resp.GetCleaned()) != 1 || len(before) != 1 || len(after) != 1 || before[0] != l.GetLaunchDir() {
		t.Fatalf("stop %+v %v (hooks %v %v)", resp, err, before, after)
	}
	if _, err := r.Get("d/0"); err == nil {
		t.Fatal("a stopped instance is still kept")
	}
	// Without a handle, the recorded launch is stopped.
	if resp, err := r.Stop(&pb.StopRequest{InstanceId: "d/0", Launch: gone(t)}, DefaultStopGrace, StopHooks{}); err != nil || !resp.GetGone() {
		t.Fatalf("stop a recorded launch %+v %v", resp, err)
	}
	if resp, err := r.Logs(&pb.LogsRequest{InstanceId: "d/0", LaunchDir: t.TempDir()}); err != nil || resp.GetText() != "" {
		t.Fatalf("logs of an empty directory %+v %v", resp, err)
	}
}

func TestNewEndpoint(t *testing.T) {
	ep := NewEndpoint(4242, "m", "k")
	if ep.GetBaseUrl() != "http://127.0.0.1:4242" || ep.GetChatPath() != ChatPath || ep.GetServedName() != "m" ||
		ep.GetAbortMode() != pb.AbortMode_ABORT_MODE_CLOSE_CONNECTION || ep.GetAuthHeader() != "Authorization" || ep.GetAuthValue() != "Bearer k" {
		t.Fatalf("endpoint %+v", ep)
	}
	if ep := NewEndpoint(4242, "m", ""); ep.GetAuthHeader() != "" || ep.GetAuthValue() != "" {
		t.Fatalf("an endpoint without a key %+v", ep)
	}
}

func TestEnv(t *testing.T) {
	host := &pb.HostPolicy{HostEnv: map[string]string{"DO_NOT_TRACK": "0", "X": "1"}}
	e := NewEnv("/bin")
	e.PinDevices(&pb.LaunchContext{DeviceUuids: []string{"GPU-a", "GPU-b"}})
	e.NoTelemetry(host)
	e.Merge(host.GetHostEnv())
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
	e.NoTelemetry(&pb.HostPolicy{EngineTelemetry: "allow"})
	e.PinDevices(&pb.LaunchContext{})
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
		host *pb.HostPolicy
		want string
	}{
		{&pb.HostPolicy{}, proc.LogModeFile},
		{&pb.HostPolicy{EngineLogs: "file", Retention: "standard"}, proc.LogModeFile},
		{&pb.HostPolicy{EngineLogs: "memory"}, proc.LogModeMemory},
		{&pb.HostPolicy{Retention: "zero"}, proc.LogModeMemory},
	}
	for _, c := range cases {
		if got := LogMode(c.host); got != c.want {
			t.Errorf("LogMode(%v) = %s, want %s", c.host, got, c.want)
		}
	}
}
