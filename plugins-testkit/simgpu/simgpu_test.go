// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package simgpu

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// The test binary doubles as a helper process that allocates on a state
// file, reports on stdout and holds its memory until stdin closes.
const helperEnv = "SIMGPU_TEST_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(helperMain(mode))
	}
	os.Exit(m.Run())
}

// helperMain runs a helper mode:
//
//	hold: allocate SIMGPU_BYTES under SIMGPU_TAG, print "ok"
//	race: print "ready", wait for a line on stdin, try SIMGPU_ATTEMPTS
//	      allocations of SIMGPU_BYTES, print the successes
func helperMain(mode string) int {
	g, err := Open(os.Getenv("SIMGPU_STATE"))
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	dev := os.Getenv("SIMGPU_DEVICE")
	n, _ := strconv.ParseInt(os.Getenv("SIMGPU_BYTES"), 10, 64)
	switch mode {
	case "hold":
		if err := g.Allocate(os.Getpid(), dev, os.Getenv("SIMGPU_TAG"), n); err != nil {
			fmt.Println("error:", err)
			return 1
		}
		fmt.Println("ok")
	case "race":
		attempts, _ := strconv.Atoi(os.Getenv("SIMGPU_ATTEMPTS"))
		fmt.Println("ready")
		in := bufio.NewReader(os.Stdin)
		if _, err := in.ReadString('\n'); err != nil { // the starting gun
			fmt.Println("error:", err)
			return 1
		}
		ok := 0
		for range attempts {
			err := g.Allocate(os.Getpid(), dev, "chunk", n)
			switch {
			case err == nil:
				ok++
			case !errors.Is(err, ErrOutOfMemory):
				fmt.Println("error:", err)
				return 1
			}
		}
		fmt.Println(ok)
	default:
		fmt.Println("error: unknown mode", mode)
		return 2
	}
	io.Copy(io.Discard, os.Stdin) // hold until the parent closes stdin
	return 0
}

// helper is a running helper process.
type helper struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Reader
	line   string
}

// spawnHelper starts the test binary in a helper mode.
func spawnHelper(t *testing.T, mode string, env ...string) *helper {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{helperEnv + "=" + mode}, env...)...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helper{cmd: cmd, stdin: stdin, stdout: bufio.NewReader(stdout)}
	t.Cleanup(func() {
		h.stdin.Close()
		h.cmd.Process.Kill()
		h.cmd.Wait()
	})
	return h
}

// readLine waits for the helper's report line.
func (h *helper) readLine(t *testing.T) string {
	t.Helper()
	line, err := h.stdout.ReadString('\n')
	if err != nil {
		t.Fatalf("helper %d: read line: %v", h.cmd.Process.Pid, err)
	}
	h.line = strings.TrimSpace(line)
	if strings.HasPrefix(h.line, "error:") {
		t.Fatalf("helper %d: %s", h.cmd.Process.Pid, h.line)
	}
	return h.line
}

// startHelper starts a helper and waits for its report line.
func startHelper(t *testing.T, mode string, env ...string) *helper {
	t.Helper()
	h := spawnHelper(t, mode, env...)
	h.readLine(t)
	return h
}

// newGPU creates a state file with devices and opens it.
func newGPU(t *testing.T, devices []Device) *GPU {
	t.Helper()
	path := filepath.Join(t.TempDir(), "simgpu.json")
	if err := Create(path, devices); err != nil {
		t.Fatal(err)
	}
	g, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestDefaultDevices(t *testing.T) {
	devs := DefaultDevices(3, 8<<30)
	again := DefaultDevices(3, 8<<30)
	uuidRE := regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for i, d := range devs {
		if d.Index != i || d.TotalBytes != 8<<30 || d.Unified || d.Name == "" {
			t.Errorf("device %d = %+v", i, d)
		}
		if !uuidRE.MatchString(d.UUID) {
			t.Errorf("device %d uuid %q is not NVML-shaped", i, d.UUID)
		}
		if seen[d.UUID] {
			t.Errorf("uuid %s repeats", d.UUID)
		}
		seen[d.UUID] = true
		if again[i].UUID != d.UUID {
			t.Errorf("device %d uuid differs between calls: %s, %s", i, d.UUID, again[i].UUID)
		}
	}
}

func TestCreate(t *testing.T) {
	good := DefaultDevices(2, 1<<30)
	cases := []struct {
		name    string
		devices []Device
		exists  bool
		wantErr error // nil: success; errAny: some error
	}{
		{name: "fresh", devices: good},
		{name: "existing file is kept", devices: good, exists: true, wantErr: fs.ErrExist},
		{name: "no devices", devices: nil, wantErr: errAny},
		{name: "duplicate uuid", devices: []Device{good[0], {Index: 1, UUID: good[0].UUID, TotalBytes: 1}}, wantErr: errAny},
		{name: "duplicate index", devices: []Device{good[0], {Index: 0, UUID: good[1].UUID, TotalBytes: 1}}, wantErr: errAny},
		{name: "zero total", devices: []Device{{Index: 0, UUID: good[0].UUID}}, wantErr: errAny},
		{name: "bad uuid", devices: []Device{{Index: 0, UUID: "0000", TotalBytes: 1}}, wantErr: errAny},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.json")
			if c.exists {
				if err := os.WriteFile(path, []byte("keep me"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			err := Create(path, c.devices)
			switch {
			case c.wantErr == nil && err != nil:
				t.Fatalf("Create: %v", err)
			case c.wantErr == errAny && err == nil, c.wantErr != nil && c.wantErr != errAny && !errors.Is(err, c.wantErr):
				t.Fatalf("Create err = %v, want %v", err, c.wantErr)
			}
			if c.exists {
				if data, _ := os.ReadFile(path); string(data) != "keep me" {
					t.Fatalf("existing file overwritten: %q", data)
				}
			}
			if c.wantErr != nil {
				return
			}
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o600 {
				t.Errorf("mode %v, want 0600", fi.Mode().Perm())
			}
			g, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			st, err := g.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			if len(st.Devices) != len(c.devices) || len(st.Allocations) != 0 {
				t.Fatalf("state = %+v", st)
			}
		})
	}
}

// errAny stands for "any error" in tables.
var errAny = errors.New("any error")

func TestGPU_Allocate(t *testing.T) {
	pid := os.Getpid()
	dev := DefaultDevices(1, 1000)[0]
	type alloc struct {
		tag   string
		bytes int64
	}
	cases := []struct {
		name     string
		before   []alloc
		device   string
		pid      int
		req      alloc
		wantErr  error
		wantUsed int64
	}{
		{name: "fits", req: alloc{"weights", 400}, wantUsed: 400},
		{name: "exact fit", before: []alloc{{"weights", 600}}, req: alloc{"kv_cache", 400}, wantUsed: 1000},
		{name: "one byte over", before: []alloc{{"weights", 600}}, req: alloc{"kv_cache", 401}, wantErr: ErrOutOfMemory, wantUsed: 600},
		{name: "same tag grows", before: []alloc{{"weights", 300}}, req: alloc{"weights", 300}, wantUsed: 600},
		{name: "zero bytes", req: alloc{"weights", 0}, wantUsed: 0},
		{name: "negative bytes", req: alloc{"weights", -1}, wantErr: errAny},
		{name: "unknown device", device: "GPU-nope", req: alloc{"weights", 1}, wantErr: ErrNoDevice},
		{name: "dead pid", pid: 1 << 30, req: alloc{"weights", 1}, wantErr: ErrNoProcess},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := newGPU(t, []Device{dev})
			for _, b := range c.before {
				if err := g.Allocate(pid, dev.UUID, b.tag, b.bytes); err != nil {
					t.Fatal(err)
				}
			}
			uuid, p := dev.UUID, pid
			if c.device != "" {
				uuid = c.device
			}
			if c.pid != 0 {
				p = c.pid
			}
			err := g.Allocate(p, uuid, c.req.tag, c.req.bytes)
			switch {
			case c.wantErr == nil && err != nil:
				t.Fatalf("Allocate: %v", err)
			case c.wantErr == errAny && err == nil, c.wantErr != nil && c.wantErr != errAny && !errors.Is(err, c.wantErr):
				t.Fatalf("Allocate err = %v, want %v", err, c.wantErr)
			}
			used, per, err := g.Usage(dev.UUID)
			if err != nil {
				t.Fatal(err)
			}
			if used != c.wantUsed || per[pid] != c.wantUsed {
				t.Fatalf("used = %d (per process %v), want %d", used, per, c.wantUsed)
			}
		})
	}
}

func TestGPU_AllocateOutOfMemoryFigures(t *testing.T) {
	dev := DefaultDevices(1, 1000)[0]
	g := newGPU(t, []Device{dev})
	if err := g.Allocate(os.Getpid(), dev.UUID, "weights", 700); err != nil {
		t.Fatal(err)
	}
	err := g.Allocate(os.Getpid(), dev.UUID, "kv_cache", 500)
	var oom *OutOfMemoryError
	if !errors.As(err, &oom) {
		t.Fatalf("err = %v, want *OutOfMemoryError", err)
	}
	if oom.Requested != 500 || oom.Used != 700 || oom.Free() != 300 || oom.Device.UUID != dev.UUID || oom.PID != os.Getpid() {
		t.Fatalf("figures = %+v", oom)
	}
	if !strings.Contains(err.Error(), "out of memory") {
		t.Fatalf("message %q", err)
	}
}

func TestGPU_Free(t *testing.T) {
	pid := os.Getpid()
	devs := DefaultDevices(2, 1000)
	cases := []struct {
		name string
		tag  string
		want map[string]int64 // tag → bytes left, over both devices
	}{
		{name: "one tag", tag: "kv_cache", want: map[string]int64{"weights": 200}},
		{name: "all of pid", tag: "", want: map[string]int64{}},
		{name: "unknown tag is a no-op", tag: "nope", want: map[string]int64{"weights": 200, "kv_cache": 200}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := newGPU(t, devs)
			for _, d := range devs {
				for _, tag := range []string{"weights", "kv_cache"} {
					if err := g.Allocate(pid, d.UUID, tag, 100); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := g.Free(pid, c.tag); err != nil {
				t.Fatal(err)
			}
			st, err := g.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]int64{}
			for _, a := range st.Allocations {
				got[a.Tag] += a.Bytes
			}
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Fatalf("left = %v, want %v", got, c.want)
			}
		})
	}
}

func TestGPU_SnapshotDropsReusedPID(t *testing.T) {
	dev := DefaultDevices(1, 1000)[0]
	g := newGPU(t, []Device{dev})
	ticks, err := ProcessStartTicks(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Our own PID with another start time stands for a PID that a new
	// process reused: its entry belongs to the dead one.
	st := State{Devices: []Device{dev}, Allocations: []Allocation{
		{PID: os.Getpid(), StartTicks: ticks + 1, DeviceUUID: dev.UUID, Tag: "old", Bytes: 10},
		{PID: os.Getpid(), StartTicks: ticks, DeviceUUID: dev.UUID, Tag: "mine", Bytes: 20},
	}}
	if err := writeState(g.Path(), st); err != nil {
		t.Fatal(err)
	}
	snap, err := g.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Allocations) != 1 || snap.Allocations[0].Tag != "mine" {
		t.Fatalf("allocations = %+v, want only the live one", snap.Allocations)
	}
	onDisk, err := readState(g.Path())
	if err != nil {
		t.Fatal(err)
	}
	if len(onDisk.Allocations) != 1 {
		t.Fatalf("cleanup not persisted: %+v", onDisk.Allocations)
	}
}

func TestGPU_SnapshotDropsKilledProcess(t *testing.T) {
	dev := DefaultDevices(1, 1<<30)[0]
	g := newGPU(t, []Device{dev})
	h := startHelper(t, "hold", "SIMGPU_STATE="+g.Path(), "SIMGPU_DEVICE="+dev.UUID, "SIMGPU_TAG=weights", "SIMGPU_BYTES=4096")
	pid := h.cmd.Process.Pid
	_, per, err := g.Usage(dev.UUID)
	if err != nil {
		t.Fatal(err)
	}
	if per[pid] != 4096 {
		t.Fatalf("helper %d holds %d, want 4096 (per process %v)", pid, per[pid], per)
	}
	if err := h.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	// Not reaped yet on purpose: a zombie holds no GPU memory.
	waitFor(t, "killed helper's allocation to vanish", func() bool {
		_, per, err := g.Usage(dev.UUID)
		return err == nil && per[pid] == 0
	})
}

func TestGPU_AllocateConcurrent(t *testing.T) {
	const (
		unit     = 7
		capacity = 100 * unit
		attempts = 40
	)
	dev := DefaultDevices(1, capacity)[0]
	g := newGPU(t, []Device{dev})

	// Three processes and four goroutines race for 100 units with 280
	// attempts, all released by one starting gun.
	var procs []*helper
	for range 3 {
		h := spawnHelper(t, "race", "SIMGPU_STATE="+g.Path(), "SIMGPU_DEVICE="+dev.UUID,
			"SIMGPU_BYTES="+strconv.Itoa(unit), "SIMGPU_ATTEMPTS="+strconv.Itoa(attempts))
		if h.readLine(t) != "ready" {
			t.Fatalf("helper said %q", h.line)
		}
		procs = append(procs, h)
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	goroutineOK := 0
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, err := Open(g.Path()) // a handle per goroutine, as separate users would
			if err != nil {
				t.Error(err)
				return
			}
			<-start
			ok := 0
			for range attempts {
				err := h.Allocate(os.Getpid(), dev.UUID, fmt.Sprintf("g%d", i), unit)
				switch {
				case err == nil:
					ok++
				case !errors.Is(err, ErrOutOfMemory):
					t.Error(err)
					return
				}
			}
			mu.Lock()
			goroutineOK += ok
			mu.Unlock()
		}()
	}
	for _, h := range procs {
		if _, err := io.WriteString(h.stdin, "go\n"); err != nil {
			t.Fatal(err)
		}
	}
	close(start)
	for _, h := range procs {
		h.readLine(t)
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	total := goroutineOK
	for _, h := range procs {
		n, err := strconv.Atoi(h.line)
		if err != nil {
			t.Fatalf("helper said %q", h.line)
		}
		total += n
	}
	used, _, err := g.Usage(dev.UUID)
	if err != nil {
		t.Fatal(err)
	}
	// Demand exceeds capacity, so every unit is taken, and exactly once.
	if total != 100 || used != capacity {
		t.Fatalf("granted %d units, device used %d bytes; want 100 units and %d bytes", total, used, capacity)
	}
}

func TestResolveDevice(t *testing.T) {
	devs := DefaultDevices(3, 1<<30)
	st := State{Devices: devs}
	cases := []struct {
		name    string
		visible string
		want    int // index; -1 for an error
	}{
		{name: "empty means 0", visible: "", want: 0},
		{name: "index", visible: "2", want: 2},
		{name: "list takes the first", visible: "1,0", want: 1},
		{name: "full uuid", visible: devs[1].UUID, want: 1},
		{name: "uuid prefix", visible: devs[2].UUID[:12], want: 2},
		{name: "uuid in a list", visible: devs[2].UUID + "," + devs[0].UUID, want: 2},
		{name: "bare prefix is ambiguous", visible: "GPU-", want: -1},
		{name: "unknown uuid", visible: "GPU-00000000-0000-0000-0000-000000000000", want: -1},
		{name: "index out of range", visible: "3", want: -1},
		{name: "no devices", visible: "-1", want: -1},
		{name: "garbage", visible: "cuda0", want: -1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := ResolveDevice(st, c.visible)
			if c.want < 0 {
				if !errors.Is(err, ErrNoDevice) {
					t.Fatalf("err = %v, want ErrNoDevice", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d.Index != c.want {
				t.Fatalf("device %d, want %d", d.Index, c.want)
			}
		})
	}
}

func TestParseStat(t *testing.T) {
	cases := []struct {
		name      string
		line      string
		wantTicks uint64
		wantState byte
		wantErr   bool
	}{
		{name: "plain", line: "42 (sleep) S 1 42 42 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 98765 1000 200", wantTicks: 98765, wantState: 'S'},
		{name: "name with spaces and parens", line: "7 (a (b) c) Z 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 555 0 0", wantTicks: 555, wantState: 'Z'},
		{name: "truncated", line: "7 (x) S 1 2 3", wantErr: true},
		{name: "no name", line: "7 x S", wantErr: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ticks, state, err := parseStat([]byte(c.line))
			if c.wantErr {
				if err == nil {
					t.Fatal("want an error")
				}
				return
			}
			if err != nil || ticks != c.wantTicks || state != c.wantState {
				t.Fatalf("= %d %c %v", ticks, state, err)
			}
		})
	}
}

// waitFor polls cond until it holds or a generous deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, 10*time.Second, what, cond)
}
