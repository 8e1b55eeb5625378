// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package role_test

// Nothing dies of use (issue 25): many starts in a row of one driver
// family, through real driver plugin processes and fake engines, and
// stop/start cycles of `capyctl dev` followed by Ctrl-C. This file holds
// its own helpers so that it can move to another package as it is.

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// startsStoriesSpec is stories260K.gguf on the fake llama-server: a
// restart_only model, so each park stops its engine and each request
// after it launches a new one.
const startsStoriesSpec = `deployment "stories" {
  engine = "llamacpp"
  model {
    path = "stories"
  }
}
`

// heldNow reads what the role holds: its start slots in use (all
// families), its engine port leases and its engine processes.
func heldNow(t *testing.T, r *harness.Role) (slots, leases float64, engines []int) {
	t.Helper()
	m, err := r.Metrics(context.Background())
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	if _, ok := m.Get("capyctl_engine_port_leases"); !ok {
		t.Fatalf("the role's metrics have no capyctl_engine_port_leases")
	}
	return m.Sum("capyctl_start_slots_in_use"), m.Sum("capyctl_engine_port_leases"), harness.EnginePIDs(r.StateDir)
}

// TestStarts_FiftyInARowThroughRealDrivers: a restart_only model on the
// llama.cpp driver (a real driver plugin process) and the fake
// llama-server is asked for, answers, and is parked (its engine stops),
// 50 times in a row. Before, every successful start kept one of the
// family's 8 start slots: the ninth request waited for ever. After every
// start no slot stays in use and one port is leased; after every park no
// port is leased and no engine runs.
func TestStarts_FiftyInARowThroughRealDrivers(t *testing.T) {
	const starts = 50
	r := harness.StartSimulated(t, harness.SimGPU{}, harness.Options{})
	r.AddLlamaServer("llamacpp")
	r.PutModel("stories", map[string]string{"stories260K.gguf": harness.StoriesGGUF()})
	if out, errOut, code := r.DeployFile("stories", startsStoriesSpec); code != 0 {
		t.Fatalf("deploy: exit %d\n%s%s", code, out, errOut)
	}
	for i := 0; i < starts; i++ {
		// Each request starts the model: bounded, so a start that waits
		// for a slot fails the test instead of hanging it.
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		resp, err := r.Chat(ctx, harness.ChatBody("stories", i%2 == 0, "Once upon a time"), nil)
		if err != nil {
			cancel()
			t.Fatalf("request %d of %d: %v\nrole output:\n%s", i+1, starts, err, r.Output())
		}
		body := harness.ReadAll(resp)
		cancel()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d of %d: %d %s", i+1, starts, resp.StatusCode, body)
		}
		slots, leases, engines := heldNow(t, r)
		if slots != 0 || leases != 1 || len(engines) == 0 {
			t.Fatalf("after start %d: %v start slots in use (want 0), %v port leases (want 1), engines %v", i+1, slots, leases, engines)
		}
		ctx, cancel = context.WithTimeout(context.Background(), 60*time.Second)
		_, err = r.Mgmt.Action(ctx, "stories", wire.ActionRequest{Action: "park", Wait: true})
		cancel()
		if err != nil {
			t.Fatalf("park %d: %v", i+1, err)
		}
		slots, leases, engines = heldNow(t, r)
		if slots != 0 || leases != 0 || len(engines) != 0 {
			t.Fatalf("after park %d: %v start slots in use, %v port leases, engines %v (want none)", i+1, slots, leases, engines)
		}
	}
	st, err := r.Mgmt.Deployment(context.Background(), "stories")
	if err != nil {
		t.Fatal(err)
	}
	if g := st.Instances[0].Generation; g < starts {
		t.Fatalf("generation %d after %d starts", g, starts)
	}
}

// devProcess is a running `capyctl dev` and what its banner said.
type devProcess struct {
	cmd    *exec.Cmd
	tmp    string
	state  string
	stderr *syncBuffer
	waited chan error
}

// syncBuffer is a goroutine-safe strings.Builder.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startDevProcess starts `capyctl dev` in its own process group with a
// private TMPDIR (its temporary state directory lands there) and reads
// its banner up to "Press Ctrl-C".
func startDevProcess(t *testing.T) *devProcess {
	t.Helper()
	bin, _ := harness.Binaries(t)
	d := &devProcess{tmp: t.TempDir(), stderr: &syncBuffer{}, waited: make(chan error, 1)}
	d.cmd = exec.Command(bin, "dev", "--listen", "127.0.0.1:0")
	d.cmd.Env = append(os.Environ(), "TMPDIR="+d.tmp)
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	d.cmd.Stderr = d.stderr
	stdout, err := d.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
		harness.KillLeftovers(d.tmp)
	})
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "State: ") {
			d.state = strings.TrimSpace(strings.TrimPrefix(line, "State: "))
		}
		if strings.HasPrefix(line, "Press Ctrl-C") {
			break
		}
	}
	go func() {
		for sc.Scan() {
		}
		d.waited <- d.cmd.Wait()
	}()
	if d.state == "" {
		t.Fatalf("capyctl dev printed no State line\n%s", d.stderr.String())
	}
	return d
}

// cli runs a capyctl command against the dev role, bounded: a command
// that hangs fails the test with the role's output.
func (d *devProcess) cli(t *testing.T, args ...string) {
	t.Helper()
	bin, _ := harness.Binaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "CAPYCTL_STATE_DIR="+d.state)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("capyctl %s did not return within 90s\n%s\nrole output:\n%s", strings.Join(args, " "), out, d.stderr.String())
	}
	if err != nil {
		t.Fatalf("capyctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// TestDev_TwelveStopStartCyclesThenCtrlC is the newcomer's loop of issue
// 25: under `capyctl dev`, `capyctl stop deployment demo --wait` and
// `capyctl start deployment demo --wait` twelve times (more than the
// family's 8 start slots), then Ctrl-C, which ends dev within 10 s (a
// bound: the test stops waiting there) and leaves no process and no
// temporary state directory behind. Before, the eighth start never
// returned, and Ctrl-C then hung.
func TestDev_TwelveStopStartCyclesThenCtrlC(t *testing.T) {
	d := startDevProcess(t)
	for i := 0; i < 12; i++ {
		d.cli(t, "stop", "deployment", "demo", "--wait")
		d.cli(t, "start", "deployment", "demo", "--wait")
	}
	if err := d.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-d.waited:
		if err != nil {
			t.Fatalf("dev exited with %v\n%s", err, d.stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("dev did not exit within 10 s of Ctrl-C\n%s", d.stderr.String())
	}
	if left := harness.Leftovers(d.state); len(left) != 0 {
		t.Fatalf("processes left after Ctrl-C: %v", describePIDs(left))
	}
	if _, err := os.Stat(d.state); !os.IsNotExist(err) {
		t.Fatalf("the temporary state directory %s remains (%v)", d.state, err)
	}
}

// describePIDs names processes by their command lines.
func describePIDs(pids []int) string {
	var out []string
	for _, pid := range pids {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		out = append(out, fmt.Sprintf("%d %s", pid, strings.ReplaceAll(strings.TrimRight(string(b), "\x00"), "\x00", " ")))
	}
	return strings.Join(out, "; ")
}
