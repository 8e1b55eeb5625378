// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakecli

import (
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/capyctl/capyctl/plugins-testkit/ports"
	"github.com/capyctl/capyctl/plugins-testkit/simgpu"
)

// Group tests run every rank as a real process of the fake, each with a
// simulated card of its own (its own CAPYCTL_SIMGPU_STATE), as each rank
// of a real group runs on its own machine. The head's rendezvous port is
// 0 and read from its log, so that no test races for a free port.

// oneCard makes a simulated machine with one card of 8 GiB.
func oneCard(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "gpu.json")
	if err := simgpu.Create(path, simgpu.DefaultDevices(1, 8<<30)); err != nil {
		t.Fatal(err)
	}
	return path
}

// heldOn is what pid holds on the card of state, per tag.
func heldOn(t *testing.T, state string, pid int) map[string]int64 {
	t.Helper()
	g, err := simgpu.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	st, err := g.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, a := range st.Allocations {
		if a.PID == pid {
			out[a.Tag] += a.Bytes
		}
	}
	return out
}

var rendezvousRE = regexp.MustCompile(`group rendezvous on (\S+):`)

// rendezvous waits for the head's rendezvous line and returns its address.
func (p *engineProc) rendezvous(t *testing.T) (host, port string) {
	t.Helper()
	var addr string
	p.waitFor(t, "the rendezvous line", func() bool {
		m := rendezvousRE.FindStringSubmatch(p.stdout.String())
		if m != nil {
			addr = m[1]
		}
		return m != nil
	})
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return host, port
}

// notServing reports that nothing answers HTTP at the engine's address.
func (p *engineProc) notServing(t *testing.T) {
	t.Helper()
	if status, body := p.get("/health"); status != 0 {
		t.Fatalf("the head answers before every rank joined: %d %s", status, body)
	}
}

// exitsWith waits for the process to end and checks its code and log.
func (p *engineProc) exitsWith(t *testing.T, code int, stderr string) {
	t.Helper()
	if got := p.wait(t); got != code || !strings.Contains(p.stderr.String(), stderr) {
		t.Fatalf("exit %d, want %d with %q on stderr:\n%s", got, code, stderr, p.stderr)
	}
}

func TestGroup_VLLMTwoRanks(t *testing.T) {
	model := modelDir(t, 2<<20) // each rank holds half
	head, worker := oneCard(t), oneCard(t)
	args := []string{"-m", vllmModule, "--model", model, "--served-model-name", "m", "--host", "127.0.0.1", "--port", "0",
		"--tensor-parallel-size", "2", "--kv-cache-memory-bytes", "1048576", "--nnodes", "2", "--master-addr", "127.0.0.1"}
	h := startProc(t, "/venv/bin/python", append(args, "--node-rank", "0", "--master-port", "0"),
		"CAPYCTL_SIMGPU_STATE="+head, "VLLM_NO_USAGE_STATS=1", "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=1")
	h.waitListening(t)
	_, port := h.rendezvous(t)
	h.notServing(t)
	if got := heldOn(t, head, h.cmd.Process.Pid); len(got) != 0 {
		t.Fatalf("the head loads before the group met: %v", got)
	}

	w := startProc(t, "/venv/bin/python", append(args, "--node-rank", "1", "--master-port", port, "--headless"),
		"CAPYCTL_SIMGPU_STATE="+worker, "VLLM_NO_USAGE_STATS=1")
	h.waitFor(t, "the head ready", func() bool { s, _ := h.get("/health"); return s == 200 })
	if status, body := h.chat(t, "m"); status != 200 {
		t.Fatalf("chat: %d %s", status, body)
	}
	want := map[string]int64{"weights": 1 << 20, "kv_cache": 1 << 20}
	for _, c := range []struct {
		name, state string
		pid         int
	}{{"head", head, h.cmd.Process.Pid}, {"worker", worker, w.cmd.Process.Pid}} {
		if got := heldOn(t, c.state, c.pid); got["weights"] != want["weights"] || got["kv_cache"] != want["kv_cache"] || len(got) != 2 {
			t.Fatalf("%s holds %v on its own card, want %v", c.name, got, want)
		}
	}
	if got := heldOn(t, head, w.cmd.Process.Pid); len(got) != 0 {
		t.Fatalf("the worker holds %v on the head's card", got)
	}
	if strings.Contains(w.stdout.String(), "listening on") {
		t.Fatalf("a headless worker serves HTTP:\n%s", w.stdout)
	}

	// A worker gone is not noticed by an idle head (vLLM's executor
	// watches its own processes only): it answers /health until a
	// request's model step, a collective, waits for the lost rank and
	// gives up after VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS.
	if err := w.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	h.waitFor(t, "the head's view of the closed connection", func() bool {
		return strings.Contains(h.stdout.String(), "group rank 1's connection closed")
	})
	if status, _ := h.get("/health"); status != 200 {
		t.Fatalf("an idle head whose worker died: /health %d, want 200 (vLLM notices at its next collective)", status)
	}
	select {
	case <-h.done:
		t.Fatalf("the head exited when its worker died:\n%s", h.stderr)
	default:
	}
	answered := make(chan int, 1)
	go func() {
		body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
		resp, err := http.Post(h.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			answered <- 0
			return
		}
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	h.exitsWith(t, 1, "RPC call to execute_model timed out")
	if status := <-answered; status == 200 {
		t.Fatalf("a request to a head whose worker died was answered")
	}
}

// TestGroup_VLLMWorkerOutlivesItsHead: a headless vLLM rank whose head is
// killed does not notice: it keeps its memory until it is stopped, which
// only the control plane does.
func TestGroup_VLLMWorkerOutlivesItsHead(t *testing.T) {
	model := modelDir(t, 2<<20)
	head, worker := oneCard(t), oneCard(t)
	args := []string{"-m", vllmModule, "--model", model, "--served-model-name", "m", "--host", "127.0.0.1", "--port", "0",
		"--tensor-parallel-size", "2", "--kv-cache-memory-bytes", "1048576", "--nnodes", "2", "--master-addr", "127.0.0.1"}
	h := startProc(t, "/venv/bin/python", append(args, "--node-rank", "0", "--master-port", "0"), "CAPYCTL_SIMGPU_STATE="+head)
	h.waitListening(t)
	_, port := h.rendezvous(t)
	w := startProc(t, "/venv/bin/python", append(args, "--node-rank", "1", "--master-port", port, "--headless"), "CAPYCTL_SIMGPU_STATE="+worker)
	h.waitFor(t, "the head ready", func() bool { s, _ := h.get("/health"); return s == 200 })
	if err := h.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	w.waitFor(t, "the worker's view of the closed connection", func() bool {
		return strings.Contains(w.stdout.String(), "the head's connection closed")
	})
	if got := heldOn(t, worker, w.cmd.Process.Pid); got["weights"] != 1<<20 {
		t.Fatalf("the worker whose head died holds %v, want its share kept", got)
	}
	select {
	case <-w.done:
		t.Fatalf("the worker exited when its head died:\n%s", w.stderr)
	default:
	}
	if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := w.wait(t); code != 0 {
		t.Fatalf("the worker's exit after SIGTERM: %d", code)
	}
}

func TestGroup_SGLangThreeRanks(t *testing.T) {
	model := modelDir(t, 3<<20) // each rank holds a third
	cards := []string{oneCard(t), oneCard(t), oneCard(t)}
	args := func(rank int, addr string) []string {
		return []string{"-m", sglangModule, "--model-path", model, "--served-model-name", "m", "--host", "127.0.0.1", "--port", "0",
			"--tp", "3", "--nnodes", "3", "--node-rank", strconv.Itoa(rank), "--dist-init-addr", addr, "--enable-metrics"}
	}
	h := startProc(t, "/venv/bin/python3", args(0, "127.0.0.1:0"), "CAPYCTL_SIMGPU_STATE="+cards[0], "CAPYCTL_FAKE_SIM_KV=1MiB")
	h.waitListening(t)
	host, port := h.rendezvous(t)
	addr := net.JoinHostPort(host, port)
	h.notServing(t)

	workers := []*engineProc{nil}
	for rank := 1; rank <= 2; rank++ {
		w := startProc(t, "/venv/bin/python3", args(rank, addr), "CAPYCTL_SIMGPU_STATE="+cards[rank], "CAPYCTL_FAKE_SIM_KV=1MiB")
		workers = append(workers, w)
		if rank == 1 {
			// Two of three ranks: still no answer.
			h.waitFor(t, "rank 1 joined", func() bool { return strings.Contains(h.stdout.String(), "rank 1 joined") })
			h.notServing(t)
		}
	}
	h.waitFor(t, "the head ready", func() bool { s, _ := h.get("/health"); return s == 200 })
	if status, body := h.chat(t, "m"); status != 200 {
		t.Fatalf("chat: %d %s", status, body)
	}
	procs := append([]*engineProc{h}, workers[1:]...)
	for rank, p := range procs {
		got := heldOn(t, cards[rank], p.cmd.Process.Pid)
		if got["weights"] != 1<<20 || got["kv_cache"] != 1<<20 {
			t.Fatalf("rank %d holds %v on its own card, want 1 MiB of weights and 1 MiB of KV", rank, got)
		}
		for other := range cards {
			if other != rank && len(heldOn(t, cards[other], p.cmd.Process.Pid)) != 0 {
				t.Fatalf("rank %d holds memory on rank %d's card", rank, other)
			}
		}
	}
	// A non-zero rank serves SGLang's health check only.
	w := workers[1]
	w.waitListening(t)
	if status, _ := w.get("/health"); status != 200 {
		t.Fatalf("worker /health: %d", status)
	}
	if status, _ := w.get("/v1/models"); status != 404 {
		t.Fatalf("worker /v1/models: %d, want 404 (no OpenAI API on a worker)", status)
	}

	// The head gone, every worker exits with an error.
	if err := h.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	for rank := 1; rank <= 2; rank++ {
		workers[rank].exitsWith(t, 1, "group rank 0 is gone")
	}
}

func TestGroup_TensorFoldPair(t *testing.T) {
	model := modelDir(t, 2<<20)
	head, worker := oneCard(t), oneCard(t)
	args := func(rank, port string) []string {
		return []string{"serve", model, "--name", "fold", "--host", "127.0.0.1", "--port", "0", "--tp", "2", "--rank", rank,
			"--master", "127.0.0.1", "--master-port", port}
	}
	h := startProc(t, "tensorfold", args("0", "0"), "CAPYCTL_SIMGPU_STATE="+head, "CAPYCTL_FAKE_SIM_WEIGHTS=1MiB", "CAPYCTL_FAKE_SIM_KV=1MiB")
	h.waitListening(t)
	_, port := h.rendezvous(t)
	// TensorFold answers /health while it loads: 503 until the pair met.
	if status, body := h.get("/health"); status != 503 {
		t.Fatalf("health before the pair met: %d %s", status, body)
	}
	w := startProc(t, "tensorfold", args("1", port), "CAPYCTL_SIMGPU_STATE="+worker, "CAPYCTL_FAKE_SIM_WEIGHTS=1MiB", "CAPYCTL_FAKE_SIM_KV=1MiB")
	h.waitFor(t, "the head ready", func() bool { s, _ := h.get("/health"); return s == 200 })
	if status, body := h.chat(t, "fold"); status != 200 {
		t.Fatalf("chat: %d %s", status, body)
	}
	if got := heldOn(t, worker, w.cmd.Process.Pid); got["weights"] != 1<<20 {
		t.Fatalf("rank 1 holds %v", got)
	}
	if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := w.wait(t); code != 0 {
		t.Fatalf("rank 1 exit %d after SIGTERM", code)
	}
	h.exitsWith(t, 1, "rank 1) is gone")
}

func TestGroup_Refusals(t *testing.T) {
	cases := []struct {
		name   string
		argv0  string
		args   []string
		env    []string
		code   int
		stderr string
	}{
		{name: "tensorfold three ranks", argv0: "tensorfold", args: []string{"serve", "/tmp", "--name", "f", "--tp", "3", "--rank", "0", "--master", "127.0.0.1", "--master-port", "1"},
			code: 2, stderr: "exactly two machines"},
		{name: "tensorfold rank without a port", argv0: "tensorfold", args: []string{"serve", "/tmp", "--name", "f", "--tp", "2", "--rank", "1", "--master", "127.0.0.1"},
			code: 2, stderr: "--master-port"},
		{name: "sglang without dist-init-addr", argv0: "/venv/bin/python3", args: []string{"-m", sglangModule, "--model-path", "/tmp", "--tp", "2", "--nnodes", "2", "--node-rank", "1"},
			code: 2, stderr: "please provide --dist-init-addr"},
		{name: "vllm machines not dividing the ranks", argv0: "/venv/bin/python", args: []string{"-m", vllmModule, "--model", "/tmp", "--tensor-parallel-size", "3", "--nnodes", "2", "--node-rank", "1", "--headless"},
			code: 2, stderr: "does not divide"},
		{name: "vllm worker that is not headless", argv0: "/venv/bin/python", args: []string{"-m", vllmModule, "--model", "/tmp", "--tensor-parallel-size", "2", "--nnodes", "2", "--node-rank", "1"},
			code: 2, stderr: "--headless"},
		{name: "vllm worker with no head", argv0: "/venv/bin/python", args: []string{"-m", vllmModule, "--model", "/tmp", "--tensor-parallel-size", "2", "--nnodes", "2", "--node-rank", "1", "--headless",
			"--master-addr", "127.0.0.1", "--master-port", "1"}, env: []string{groupJoinTimeoutEnv + "=200ms"},
			code: 1, stderr: "unreachable"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := startProc(t, c.argv0, c.args, c.env...)
			p.exitsWith(t, c.code, c.stderr)
		})
	}
}

// TestGroup_WrongWorkerRefused: a worker that does not fit the head's
// group is refused and exits; the head keeps waiting for a right one.
func TestGroup_WrongWorkerRefused(t *testing.T) {
	args := []string{"-m", vllmModule, "--model", t.TempDir(), "--served-model-name", "m", "--host", "127.0.0.1", "--port", "0",
		"--tensor-parallel-size", "2", "--master-addr", "127.0.0.1"}
	h := startProc(t, "/venv/bin/python", append(args, "--nnodes", "2", "--node-rank", "0", "--master-port", "0"), "VLLM_NO_USAGE_STATS=1")
	_, port := h.rendezvous(t)
	bad := startProc(t, "/venv/bin/python", []string{"-m", vllmModule, "--model", "/tmp", "--tensor-parallel-size", "4", "--nnodes", "4",
		"--node-rank", "3", "--headless", "--master-addr", "127.0.0.1", "--master-port", port})
	bad.exitsWith(t, 1, "nnodes 4, the head has 2")
	h.waitListening(t)
	h.notServing(t)
	good := startProc(t, "/venv/bin/python", append(args, "--nnodes", "2", "--node-rank", "1", "--master-port", port, "--headless"))
	h.waitFor(t, "the head ready", func() bool { s, _ := h.get("/health"); return s == 200 })
	if err := h.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := h.wait(t); code != 0 {
		t.Fatalf("head exit %d after SIGTERM", code)
	}
	// A headless vLLM rank does not notice its head is gone: it waits
	// until it is stopped.
	good.waitFor(t, "the worker's view of the closed connection", func() bool {
		return strings.Contains(good.stdout.String(), "the head's connection closed")
	})
	if err := good.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := good.wait(t); code != 0 {
		t.Fatalf("worker exit %d after SIGTERM", code)
	}
}

// post sends a POST with a JSON body (none when empty) and returns the
// status and body; status 0 when the request fails.
func (p *engineProc) post(path, body string) (int, string) {
	resp, err := http.Post(p.url+path, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

// testGroup is a group's rank processes, in rank order, and their
// cards, one each.
type testGroup struct {
	procs []*engineProc // rank order; 0 is the head
	cards []string
}

// startVLLMGroup starts a vLLM group of n ranks on loopback, each rank a
// process with a card of its own, serving with sleep mode in dev mode.
// Each rank holds 1 MiB of weights (a model of n MiB split over n
// machines) and 1 MiB of KV cache.
func startVLLMGroup(t *testing.T, n int) *testGroup {
	t.Helper()
	model := modelDir(t, int64(n)<<20)
	g := &testGroup{}
	args := func(rank int, port string) []string {
		a := []string{"-m", vllmModule, "--model", model, "--served-model-name", "m", "--host", "127.0.0.1", "--port", "0",
			"--tensor-parallel-size", strconv.Itoa(n), "--kv-cache-memory-bytes", "1048576", "--enable-sleep-mode",
			"--nnodes", strconv.Itoa(n), "--node-rank", strconv.Itoa(rank), "--master-addr", "127.0.0.1", "--master-port", port}
		if rank > 0 {
			a = append(a, "--headless")
		}
		return a
	}
	for rank := range n {
		g.cards = append(g.cards, oneCard(t))
		port := "0"
		if rank > 0 {
			_, port = g.procs[0].rendezvous(t)
		}
		p := startProc(t, "/venv/bin/python", args(rank, port),
			"CAPYCTL_SIMGPU_STATE="+g.cards[rank], "VLLM_SERVER_DEV_MODE=1", "VLLM_NO_USAGE_STATS=1")
		if rank == 0 {
			p.waitListening(t)
		}
		g.procs = append(g.procs, p)
	}
	h := g.procs[0]
	h.waitFor(t, "the head ready", func() bool { s, _ := h.get("/health"); return s == 200 })
	return g
}

// holds checks that every rank holds exactly want on its own card and
// nothing on the others'.
func (g *testGroup) holds(t *testing.T, state string, want map[string]int64) {
	t.Helper()
	for rank, p := range g.procs {
		pid := p.cmd.Process.Pid
		if got := heldOn(t, g.cards[rank], pid); !maps.Equal(got, want) {
			t.Fatalf("%s: rank %d holds %v on its own card, want %v", state, rank, got, want)
		}
		for other, card := range g.cards {
			if other != rank && len(heldOn(t, card, pid)) != 0 {
				t.Fatalf("%s: rank %d holds memory on rank %d's card", state, rank, other)
			}
		}
	}
}

// sleeping checks GET /is_sleeping on the head.
func (g *testGroup) sleeping(t *testing.T, want bool) {
	t.Helper()
	status, body := g.procs[0].get("/is_sleeping")
	if status != 200 || strings.TrimSpace(body) != `{"is_sleeping":`+strconv.FormatBool(want)+`}` {
		t.Fatalf("is_sleeping: %d %s, want %v", status, body, want)
	}
}

// must sends a POST to the head and wants 200.
func (g *testGroup) must(t *testing.T, path, body string) {
	t.Helper()
	if status, answer := g.procs[0].post(path, body); status != 200 {
		t.Fatalf("POST %s: %d %s", path, status, answer)
	}
}

// TestGroup_VLLMSleepWake: sleep, wake_up and reload_weights on the head
// act on every rank, each on its own card, and the head answers once
// every rank has: right after the answer every rank's memory has changed.
func TestGroup_VLLMSleepWake(t *testing.T) {
	const mib = 1 << 20
	awake := map[string]int64{"weights": mib, "kv_cache": mib}
	asleep := map[string]int64{"park_residue": defaultParkResidue} // a single engine's residue, on each rank
	weightsBack := map[string]int64{"weights": mib, "park_residue": defaultParkResidue}
	for _, n := range []int{2, 3} {
		t.Run(strconv.Itoa(n)+" ranks", func(t *testing.T) {
			g := startVLLMGroup(t, n)
			h := g.procs[0]
			g.holds(t, "awake", awake)
			g.sleeping(t, false)
			for cycle := 1; cycle <= 5; cycle++ {
				g.must(t, "/sleep?level=2", "")
				g.holds(t, "asleep", asleep)
				g.sleeping(t, true)
				g.must(t, "/wake_up?tags=weights", "")
				g.holds(t, "weights woken", weightsBack)
				g.sleeping(t, true)
				g.must(t, "/collective_rpc", `{"method":"reload_weights"}`)
				for _, w := range g.procs[1:] {
					// The log comes through a pipe, after the answer maybe.
					w.waitFor(t, "the reload", func() bool {
						return strings.Count(w.stdout.String(), "reloaded its share of the weights") == cycle
					})
				}
				g.must(t, "/wake_up?tags=kv_cache", "")
				g.holds(t, "awake", awake)
				g.sleeping(t, false)
				if status, body := h.chat(t, "m"); status != 200 || strings.Contains(body, "!!") {
					t.Fatalf("cycle %d: chat after the wake: %d %s", cycle, status, body)
				}
			}

			// A worker gone while the group sleeps: the head's next wake_up,
			// a collective RPC with no timeout, waits for it until the
			// head is stopped; the other workers wait too.
			g.must(t, "/sleep?level=2", "")
			g.holds(t, "asleep", asleep)
			last := g.procs[n-1]
			if err := last.cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			h.waitFor(t, "the head's view of the closed connection", func() bool {
				return strings.Contains(h.stdout.String(), "group rank "+strconv.Itoa(n-1)+"'s connection closed")
			})
			woke := make(chan int, 1)
			go func() { status, _ := h.post("/wake_up", ""); woke <- status }()
			select {
			case <-h.done:
				t.Fatalf("the head exited by itself after losing a worker:\n%s", h.stderr)
			default:
			}
			if err := h.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			h.wait(t)
			if status := <-woke; status == 200 {
				t.Fatalf("wake_up of a group that lost rank %d answered 200", n-1)
			}
			for _, w := range g.procs[1 : n-1] {
				w.waitFor(t, "the worker's view of the closed connection", func() bool {
					return strings.Contains(w.stdout.String(), "the head's connection closed")
				})
				if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
				if code := w.wait(t); code != 0 {
					t.Fatalf("worker exit %d after SIGTERM", code)
				}
			}
		})
	}
}

// TestGroup_VLLMWakeFailsOnAWorker: a worker that cannot take its share
// back (its card is full) fails the head's wake_up with vLLM's 500; the
// head stays asleep and holds what it held, the group lives on, and a
// later wake succeeds.
func TestGroup_VLLMWakeFailsOnAWorker(t *testing.T) {
	g := startVLLMGroup(t, 2)
	h := g.procs[0]
	g.must(t, "/sleep?level=2", "")
	asleep := map[string]int64{"park_residue": defaultParkResidue}
	g.holds(t, "asleep", asleep)

	// Someone else fills the worker's card.
	gpu, err := simgpu.Open(g.cards[1])
	if err != nil {
		t.Fatal(err)
	}
	st, err := gpu.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	dev := st.Devices[0]
	if err := gpu.Allocate(os.Getpid(), dev.UUID, "hog", dev.TotalBytes-defaultParkResidue); err != nil {
		t.Fatal(err)
	}
	status, body := h.post("/wake_up", "")
	if status != 500 || !strings.Contains(body, "group rank 1") {
		t.Fatalf("wake_up with the worker's card full: %d %s, want 500 naming rank 1", status, body)
	}
	g.holds(t, "after the failed wake", asleep)
	g.sleeping(t, true)

	if err := gpu.Free(os.Getpid(), "hog"); err != nil {
		t.Fatal(err)
	}
	g.must(t, "/wake_up", "")
	g.holds(t, "awake", map[string]int64{"weights": 1 << 20, "kv_cache": 1 << 20})
	g.sleeping(t, false)
}

// TestGroup_SGLangMemoryOccupation: SGLang's rank 0 scheduler broadcasts
// every request to the schedulers of all ranks, so releasing and resuming
// the memory occupation on the head of a group acts on every rank, each
// on its own card, tag by tag.
func TestGroup_SGLangMemoryOccupation(t *testing.T) {
	const mib = 1 << 20
	model := modelDir(t, 3*mib)
	cards := []string{oneCard(t), oneCard(t), oneCard(t)}
	args := func(rank int, addr string) []string {
		return []string{"-m", sglangModule, "--model-path", model, "--served-model-name", "m", "--host", "127.0.0.1", "--port", "0",
			"--tp", "3", "--nnodes", "3", "--node-rank", strconv.Itoa(rank), "--dist-init-addr", addr, "--enable-memory-saver"}
	}
	h := startProc(t, "/venv/bin/python3", args(0, "127.0.0.1:0"), "CAPYCTL_SIMGPU_STATE="+cards[0], "CAPYCTL_FAKE_SIM_KV=1MiB")
	h.waitListening(t)
	host, port := h.rendezvous(t)
	procs := []*engineProc{h}
	for rank := 1; rank <= 2; rank++ {
		procs = append(procs, startProc(t, "/venv/bin/python3", args(rank, net.JoinHostPort(host, port)),
			"CAPYCTL_SIMGPU_STATE="+cards[rank], "CAPYCTL_FAKE_SIM_KV=1MiB"))
	}
	h.waitFor(t, "the head ready", func() bool { s, _ := h.get("/health"); return s == 200 })
	g := &testGroup{procs: procs, cards: cards}
	steps := []struct {
		path, body string
		want       map[string]int64
	}{
		{"/release_memory_occupation", `{"tags":["kv_cache"]}`, map[string]int64{"weights": mib, "park_residue": defaultParkResidue}},
		{"/release_memory_occupation", `{}`, map[string]int64{"park_residue": defaultParkResidue}},
		{"/resume_memory_occupation", `{"tags":["weights"]}`, map[string]int64{"weights": mib, "park_residue": defaultParkResidue}},
		{"/resume_memory_occupation", `{"tags":["kv_cache"]}`, map[string]int64{"weights": mib, "kv_cache": mib}},
	}
	for _, s := range steps {
		g.must(t, s.path, s.body)
		g.holds(t, s.path+" "+s.body, s.want)
	}
}

// TestGroup_SGLangDPAttentionPorts: an SGLang head with DP attention holds
// the six ports after its --dist-init-addr port (its ZeroMQ sockets), so a
// second head given the next rendezvous port on the same host cannot
// start, and a head whose next ports something else holds waits and then
// fails in SGLang's words. Without DP attention a head holds its port
// alone.
func TestGroup_SGLangDPAttentionPorts(t *testing.T) {
	p := ports.LeaseRange(t, 8)
	args := func(port int, dp bool) []string {
		a := []string{"-m", sglangModule, "--model-path", t.TempDir(), "--served-model-name", "m", "--host", "127.0.0.1", "--port", "0",
			"--tp", "2", "--nnodes", "2", "--node-rank", "0", "--dist-init-addr", hostPort("127.0.0.1", port)}
		if dp {
			a = append(a, "--enable-dp-attention")
		}
		return a
	}
	held := func(port int) bool {
		c, err := net.Dial("tcp", hostPort("127.0.0.1", port))
		if err == nil {
			c.Close()
		}
		return err == nil
	}

	a := startProc(t, "/venv/bin/python3", args(p, true), portWaitEnv+"=1s")
	a.rendezvous(t)
	for port := p + 1; port <= p+6; port++ {
		if !held(port) {
			t.Fatalf("a head with DP attention does not hold port %d (its rendezvous port is %d)", port, p)
		}
	}
	if held(p + 7) {
		t.Fatalf("the head holds port %d, beyond its six", p+7)
	}
	b := startProc(t, "/venv/bin/python3", args(p+1, false), portWaitEnv+"=1s")
	b.exitsWith(t, 1, "address already in use")
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	a.wait(t)

	// Something else on a port after the rendezvous port: the head waits,
	// then fails as wait_port_available does.
	ln, err := net.Listen("tcp", hostPort("127.0.0.1", p+3))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c := startProc(t, "/venv/bin/python3", args(p, true), portWaitEnv+"=1s")
	c.exitsWith(t, 1, fmt.Sprintf("rpc_port at %d is not available in 1 seconds", p+3))
	// Without DP attention the same head starts: only its port is its.
	d := startProc(t, "/venv/bin/python3", args(p, false), portWaitEnv+"=1s")
	d.rendezvous(t)
}

// TestGroup_NCCLNetIB: ranks told NCCL_NET=IB (require_rdma) on machines
// without an RDMA device fail their start as NCCL does, instead of falling
// back to TCP; with a device they serve; without NCCL_NET they fall back
// and serve.
func TestGroup_NCCLNetIB(t *testing.T) {
	withDevice := t.TempDir()
	if err := os.WriteFile(filepath.Join(withDevice, "mlx5_0"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		env    []string
		serves bool
	}{
		{name: "IB required, no device", env: []string{"NCCL_NET=IB", rdmaDirEnv + "=" + t.TempDir()}},
		{name: "IB required, a device", env: []string{"NCCL_NET=IB", rdmaDirEnv + "=" + withDevice}, serves: true},
		{name: "no network named, no device: TCP", env: []string{rdmaDirEnv + "=" + t.TempDir()}, serves: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := []string{"-m", vllmModule, "--model", modelDir(t, 2<<20), "--served-model-name", "m", "--host", "127.0.0.1", "--port", "0",
				"--tensor-parallel-size", "2", "--nnodes", "2", "--master-addr", "127.0.0.1"}
			h := startProc(t, "/venv/bin/python", append(args, "--node-rank", "0", "--master-port", "0"), c.env...)
			h.waitListening(t)
			_, port := h.rendezvous(t)
			w := startProc(t, "/venv/bin/python", append(args, "--node-rank", "1", "--master-port", port, "--headless"), c.env...)
			if !c.serves {
				h.exitsWith(t, 1, "network IB not found")
				w.exitsWith(t, 1, "")
				return
			}
			h.waitFor(t, "the head ready", func() bool { s, _ := h.get("/health"); return s == 200 })
		})
	}
}
