// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Group mode: one model across several machines, one engine rank per
// machine, head (rank 0) first. The real engines meet over their own
// distributed runtime (torch.distributed's TCP store on the head's
// rendezvous port, then NCCL or Gloo); the fake meets over a protocol of
// its own on the same port, small enough to read here.
//
// IMPORTANT: this protocol is the fake's, not any engine's. Nothing but
// another fake speaks it; a driver must never depend on it.
//
// Protocol 2, text lines over one TCP connection per worker, opened by the
// worker to the head's rendezvous address:
//
//	worker → head   capyctl-fake-group/2 hello engine=<family> rank=<r> nnodes=<n>
//	head → worker   ok                          (or "refused <reason>", then close)
//	head → worker   load                        (every rank has joined)
//	worker → head   loaded                      (its share is on its own card)
//	head → worker   serving                     (the head answers HTTP now)
//
// After "serving" the head sends a command only when its engine API is
// asked for one that every rank carries out, one command at a time, and
// each worker answers it once, with the answer below or "error <message>":
//
//	head → worker   sleep <level> <tag>...      (vLLM's POST /sleep, SGLang's
//	                                             /release_memory_occupation)
//	worker → head   slept                       (the tags released on its card,
//	                                             the park residue held)
//	head → worker   wake <tag>...               (vLLM's POST /wake_up, SGLang's
//	                                             /resume_memory_occupation)
//	worker → head   woke                        (the tags back on its card; the
//	                                             residue freed once none is left
//	                                             released)
//	head → worker   reload                      (vLLM's POST /collective_rpc
//	                                             {"method": "reload_weights"})
//	worker → head   reloaded                    (refused while its weights sleep)
//
// Tags are TagWeights and TagKVCache. This is how the real engines do it:
// vLLM's engine core runs sleep, wake_up and reload_weights as a
// collective RPC on every worker of its executor, headless machines
// included, and answers the API call once every rank returned (an
// exception on any rank fails the call, 500); SGLang's scheduler on rank
// 0 broadcasts each request, memory occupation included, to the
// schedulers of every rank. The head carries a command out on every
// worker first and on itself last, so that a failure leaves the head's
// own state (vLLM's is_sleeping) as it was, as vLLM's executor sets its
// is_sleeping flag only after the collective RPC returned. A worker that
// failed a command keeps the group alive (the call fails); a worker gone
// fails the call and the group.
//
// Otherwise the connection only carries life.
// Either end reading EOF or an error means the peer is gone (a killed
// process's sockets are closed by its kernel). What the survivor does then
// is its engine's (GroupConfig.PeerLoss):
//
//   - PeerLossExit (SGLang, TensorFold): it fails at once the way the real
//     engine does (GroupConfig.LostLog, exit status 1). SGLang's schedulers
//     broadcast over a Gloo group on every loop, so a closed peer fails them
//     at once (FactSGLangPeerLoss).
//   - PeerLossHang (vLLM): nothing happens until the next collective. The
//     head keeps serving /health with 200 while idle; a request's model
//     step waits for the lost rank until CollectiveTimeout and then the
//     engine dies (exit 1), as vLLM's execute_model gives up after
//     VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS; a park, wake or reload (a
//     collective RPC with no timeout) waits until the engine is stopped. A
//     worker whose head is gone stays up, holding its memory, until it is
//     stopped (FactVLLMPeerLoss).
//     IMPORTANT: only the control plane (CapyCTL's group supervision) ends
//     such a group; a test that kills one rank proves it.
//
// During the start every engine fails at once. A worker that cannot reach
// the head retries until JoinTimeout, as a torch store client does; a head
// waits as long for every rank.
//
// What this does not reproduce: a peer that vanishes without closing its
// socket (a cable pulled, a machine frozen) is seen only when the kernel
// gives up on the connection; a real engine notices it at its next
// collective or when NCCL's or Gloo's timeout fires, which is what
// CapyCTL's group stall check exists for.

// GroupProtocol is the first word of a worker's hello.
const GroupProtocol = "capyctl-fake-group/2"

// DefaultGroupJoinTimeout bounds how long a head waits for its ranks and a
// worker retries its head: torch.distributed's default process-group
// timeout for NCCL (600 s, as vLLM's ParallelConfig documents it).
const DefaultGroupJoinTimeout = 10 * time.Minute

// DefaultCollectiveTimeout bounds a collective whose peer is gone under
// PeerLossHang: vLLM's VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS default (300 s).
const DefaultCollectiveTimeout = 300 * time.Second

// PeerLoss is what a rank does when a peer's connection ends after the
// group serves.
type PeerLoss int

// Peer loss policies (see the protocol above).
const (
	// PeerLossExit fails at once with exit status 1.
	PeerLossExit PeerLoss = iota
	// PeerLossHang carries on until a collective needs the lost peer.
	PeerLossHang
)

// GroupConfig puts an engine in a group.
type GroupConfig struct {
	// Engine is the family ("vllm", "sglang", "tensorfold"); a worker of
	// another family is refused.
	Engine string
	// Rank is this process's node rank: 0 is the head.
	Rank int
	// Size is the number of ranks (machines) in the group, at least 2.
	Size int
	// Addr is the head's rendezvous address ("host:port"): the head
	// listens there (unless Listener is set), a worker connects to it.
	Addr string
	// Listener, on the head, is the rendezvous listener already bound
	// (the binary binds it first so that a busy port fails at once and
	// port 0 can be logged). The engine closes it.
	Listener net.Listener
	// JoinTimeout bounds the rendezvous (DefaultGroupJoinTimeout when 0).
	JoinTimeout time.Duration
	// LostLog is the error line a survivor logs when a peer is gone, as
	// its engine words it; %d is the lost rank (the head's is 0).
	LostLog string
	// PeerLoss is what a rank does when a peer is gone after the group
	// serves (PeerLossExit when zero).
	PeerLoss PeerLoss
	// CollectiveTimeout bounds, under PeerLossHang, a collective that
	// waits for a lost peer (DefaultCollectiveTimeout when 0); StuckLog
	// is what the engine logs when it gives up.
	CollectiveTimeout time.Duration
	StuckLog          string
	// NCCLNet is the rank's NCCL_NET ("" when unset): "IB" makes the rank
	// fail its start, as NCCL's communicator init does, where RDMADir lists
	// no device; "Socket" or unset uses TCP sockets (NCCL's fallback); any
	// other name fails (FactNCCLNet).
	NCCLNet string
	// RDMADir lists the machine's RDMA devices (DefaultRDMADir when "").
	RDMADir string
}

// DefaultRDMADir is where Linux lists a machine's InfiniBand and RoCE
// devices.
const DefaultRDMADir = "/sys/class/infiniband"

// checkNet is NCCL's choice of network at a communicator's init: the one
// NCCL_NET names, or the best available with TCP sockets as the fallback.
func (g *GroupConfig) checkNet() error {
	dir := g.RDMADir
	if dir == "" {
		dir = DefaultRDMADir
	}
	entries, _ := os.ReadDir(dir)
	switch {
	case g.NCCLNet == "" || strings.EqualFold(g.NCCLNet, "Socket"):
		return nil
	case strings.EqualFold(g.NCCLNet, "IB") && len(entries) > 0:
		return nil
	}
	return fmt.Errorf("NCCL WARN Error: network %s not found. RuntimeError: NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details)", g.NCCLNet)
}

// validate checks the configuration.
func (g *GroupConfig) validate() error {
	switch {
	case g.Size < 2:
		return fmt.Errorf("group of %d ranks: a group has at least 2", g.Size)
	case g.Rank < 0 || g.Rank >= g.Size:
		return fmt.Errorf("group rank %d out of range [0, %d)", g.Rank, g.Size)
	case g.Addr == "" && g.Listener == nil:
		return errors.New("group without a rendezvous address")
	case g.Engine == "":
		return errors.New("group without an engine family")
	}
	return nil
}

func (g *GroupConfig) joinTimeout() time.Duration {
	if g.JoinTimeout > 0 {
		return g.JoinTimeout
	}
	return DefaultGroupJoinTimeout
}

func (g *GroupConfig) collectiveTimeout() time.Duration {
	if g.CollectiveTimeout > 0 {
		return g.CollectiveTimeout
	}
	return DefaultCollectiveTimeout
}

// lostLine is the survivor's error line.
func (g *GroupConfig) lostLine(rank int) string {
	if g.LostLog == "" {
		return fmt.Sprintf("group rank %d is gone", rank)
	}
	return fmt.Sprintf(g.LostLog, rank)
}

// groupPeer is a worker's connection on the head.
type groupPeer struct {
	rank int
	conn net.Conn
	rd   *bufio.Reader
	// replies carries the worker's answers after "serving"; its watcher
	// closes it when the connection ends.
	replies chan string
}

// groupHead is the head's side of the rendezvous. Its goroutines are
// owned by it and end with close.
type groupHead struct {
	cfg   *GroupConfig
	ln    net.Listener
	peers map[int]*groupPeer
	lost  chan int // ranks whose connection ended, first one wins
	once  sync.Once
	wg    sync.WaitGroup
	done  chan struct{} // closed by close: watchers stop delivering

	// callMu makes one command at a time (call).
	callMu sync.Mutex
}

// listenGroup binds the head's rendezvous listener.
func listenGroup(cfg *GroupConfig) (*groupHead, error) {
	ln := cfg.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", cfg.Addr); err != nil {
			return nil, fmt.Errorf("group rendezvous: %w", err)
		}
	}
	return &groupHead{cfg: cfg, ln: ln, peers: map[int]*groupPeer{}, lost: make(chan int, 1), done: make(chan struct{})}, nil
}

// gather accepts workers until every rank has said hello, refusing the
// wrong ones, within the join timeout or until ctx ends.
func (h *groupHead) gather(ctx context.Context, logf func(Level, string, ...any)) error {
	deadline := time.Now().Add(h.cfg.joinTimeout())
	stop := context.AfterFunc(ctx, func() { h.ln.Close() })
	defer stop()
	if d, ok := h.ln.(interface{ SetDeadline(time.Time) error }); ok {
		_ = d.SetDeadline(deadline)
	}
	for len(h.peers) < h.cfg.Size-1 {
		c, err := h.ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return fmt.Errorf("group rendezvous timed out after %s with %d of %d ranks", h.cfg.joinTimeout(), len(h.peers)+1, h.cfg.Size)
			}
			return fmt.Errorf("group rendezvous: %w", err)
		}
		_ = c.SetDeadline(deadline)
		rd := bufio.NewReader(c)
		line, err := rd.ReadString('\n')
		if err != nil {
			c.Close()
			continue
		}
		rank, reason := h.admit(strings.TrimSpace(line))
		if reason != "" {
			fmt.Fprintf(c, "refused %s\n", reason)
			c.Close()
			logf(LevelWarn, "group rendezvous: refused a worker from %s: %s", c.RemoteAddr(), reason)
			continue
		}
		if _, err := fmt.Fprintf(c, "ok\n"); err != nil {
			c.Close()
			continue
		}
		h.peers[rank] = &groupPeer{rank: rank, conn: c, rd: rd, replies: make(chan string, 1)}
		logf(LevelInfo, "group rendezvous: rank %d joined from %s (%d of %d)", rank, c.RemoteAddr(), len(h.peers)+1, h.cfg.Size)
	}
	h.ln.Close() // the real store keeps listening; the fake needs no more
	return nil
}

// admit checks a hello; it returns the rank or a reason to refuse.
func (h *groupHead) admit(line string) (int, string) {
	f := strings.Fields(line)
	if len(f) < 2 || f[0] != GroupProtocol || f[1] != "hello" {
		return 0, "not a " + GroupProtocol + " hello"
	}
	kv := map[string]string{}
	for _, p := range f[2:] {
		if k, v, ok := strings.Cut(p, "="); ok {
			kv[k] = v
		}
	}
	rank, err1 := strconv.Atoi(kv["rank"])
	size, err2 := strconv.Atoi(kv["nnodes"])
	switch {
	case err1 != nil || err2 != nil:
		return 0, "hello without rank and nnodes"
	case kv["engine"] != h.cfg.Engine:
		return 0, fmt.Sprintf("engine %q in a %s group", kv["engine"], h.cfg.Engine)
	case size != h.cfg.Size:
		return 0, fmt.Sprintf("nnodes %d, the head has %d", size, h.cfg.Size)
	case rank < 1 || rank >= size:
		return 0, fmt.Sprintf("rank %d is not a worker rank of %d", rank, size)
	case h.peers[rank] != nil:
		return 0, fmt.Sprintf("rank %d joined already", rank)
	}
	return rank, ""
}

// broadcast sends a line to every worker.
func (h *groupHead) broadcast(line string) error {
	for _, p := range h.peers {
		if _, err := fmt.Fprintf(p.conn, "%s\n", line); err != nil {
			return fmt.Errorf("group rank %d: %w", p.rank, err)
		}
	}
	return nil
}

// waitLoaded waits for every worker's "loaded"; a worker that fails its
// load closes its connection, which fails the head's start.
func (h *groupHead) waitLoaded(ctx context.Context) error {
	deadline := time.Now().Add(h.cfg.joinTimeout())
	errs := make(chan error, len(h.peers))
	for _, p := range h.peers {
		go func() {
			_ = p.conn.SetReadDeadline(deadline)
			line, err := p.rd.ReadString('\n')
			switch {
			case err != nil:
				errs <- fmt.Errorf("%w (rank %d: %v)", errGroupRankLost, p.rank, err)
			case strings.TrimSpace(line) != "loaded":
				errs <- fmt.Errorf("group rank %d said %q, want loaded", p.rank, strings.TrimSpace(line))
			default:
				errs <- nil
			}
		}()
	}
	stop := context.AfterFunc(ctx, func() {
		for _, p := range h.peers {
			_ = p.conn.SetReadDeadline(time.Now())
		}
	})
	defer stop()
	var first error
	for range h.peers {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return first
}

// errGroupRankLost is a worker gone during the start.
var errGroupRankLost = errors.New("group rank lost")

// watch starts one goroutine per worker that delivers the worker's
// answers on its replies and, when its connection ends, closes replies and
// reports the worker's rank on lost. The goroutines end with close.
func (h *groupHead) watch() {
	for _, p := range h.peers {
		_ = p.conn.SetDeadline(time.Time{})
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			defer close(p.replies)
			for {
				line, err := p.rd.ReadString('\n')
				if err != nil {
					select {
					case h.lost <- p.rank:
					default:
					}
					return
				}
				select {
				case p.replies <- strings.TrimSpace(line):
				case <-h.done:
					return
				}
			}
		}()
	}
}

// call sends cmd to every worker and waits until each has answered want
// (or "error <message>") or is gone. It waits for every worker even when
// one failed, so that no answer is left to be read as the next command's.
// It returns nil when every worker answered want; otherwise the first
// failure by rank, wrapping errGroupRankLost for a worker gone.
func (h *groupHead) call(cmd, want string) error {
	h.callMu.Lock()
	defer h.callMu.Unlock()
	ranks := slices.Sorted(maps.Keys(h.peers))
	errs := make([]error, len(ranks))
	sent := make([]bool, len(ranks))
	for i, r := range ranks {
		p := h.peers[r]
		if _, err := fmt.Fprintf(p.conn, "%s\n", cmd); err != nil {
			errs[i] = fmt.Errorf("%w (rank %d: %v)", errGroupRankLost, r, err)
			continue
		}
		sent[i] = true
	}
	for i, r := range ranks {
		if !sent[i] {
			continue
		}
		line, ok := <-h.peers[r].replies
		switch {
		case !ok:
			errs[i] = fmt.Errorf("%w (rank %d: its connection closed during %q)", errGroupRankLost, r, cmd)
		case line == want:
		case strings.HasPrefix(line, "error "):
			errs[i] = fmt.Errorf("group rank %d: %s", r, strings.TrimPrefix(line, "error "))
		default:
			errs[i] = fmt.Errorf("group rank %d answered %q to %q, want %q", r, line, cmd, want)
		}
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// close ends every connection and waits for the watchers.
func (h *groupHead) close() {
	h.once.Do(func() {
		close(h.done)
		h.ln.Close()
		for _, p := range h.peers {
			p.conn.Close()
		}
	})
	h.wg.Wait()
}

// runGroupHead plays the head's part of a start: gather every rank, tell
// them to load, load its own share, wait for theirs. It returns the head,
// which Run watches, or an *ExitError; nil and nil when ctx ended.
func (e *Engine) runGroupHead(ctx context.Context) (*groupHead, error) {
	g := e.cfg.Group
	h, err := listenGroup(g)
	if err != nil {
		e.Logf(LevelError, "%v", err)
		return nil, &ExitError{Code: 1, Reason: err.Error()}
	}
	e.Logf(LevelInfo, "group rendezvous on %s: waiting for %d more ranks", h.ln.Addr(), g.Size-1)
	if err := h.gather(ctx, e.Logf); err != nil {
		h.close()
		if ctx.Err() != nil {
			return nil, nil
		}
		e.Logf(LevelError, "%v", err)
		return nil, &ExitError{Code: 1, Reason: err.Error()}
	}
	if err := g.checkNet(); err != nil {
		h.close()
		e.Logf(LevelError, "%v", err)
		return nil, &ExitError{Code: 1, Reason: err.Error()}
	}
	if err := h.broadcast("load"); err != nil {
		h.close()
		e.Logf(LevelError, "%v", err)
		return nil, &ExitError{Code: 1, Reason: err.Error()}
	}
	return h, nil
}

// GroupWorker is a worker rank: it joins the head, holds its share of the
// model on its own simulated card and serves no engine API. Create it with
// NewGroupWorker, run it with Run.
type GroupWorker struct {
	cfg    GroupConfig
	logf   func(Level, string, ...any)
	mem    *simMemory
	joined chan struct{}

	// The head's commands run on Run's goroutine; mu guards what Asleep
	// reads.
	mu     sync.Mutex
	asleep bool
	parked map[string]bool // tags released by sleep and not yet woken
}

// NewGroupWorker builds a worker of cfg (Rank ≥ 1) holding sim on its
// simulated card; logf writes its log lines.
func NewGroupWorker(cfg GroupConfig, sim SimConfig, logf func(Level, string, ...any)) (*GroupWorker, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("new group worker: %w", err)
	}
	if cfg.Rank == 0 {
		return nil, errors.New("new group worker: rank 0 is the head")
	}
	if err := sim.validate(); err != nil {
		return nil, fmt.Errorf("new group worker: %w", err)
	}
	return &GroupWorker{cfg: cfg, logf: logf, mem: &simMemory{cfg: sim, held: map[string]int64{}}, joined: make(chan struct{}), parked: map[string]bool{}}, nil
}

// Ready is closed once the worker has loaded its share and the head
// serves.
func (w *GroupWorker) Ready() <-chan struct{} { return w.joined }

// Held is what the worker holds on its simulated card, per tag.
func (w *GroupWorker) Held() map[string]int64 { return w.mem.snapshot() }

// Run joins the head, loads, and waits. It returns nil when ctx ends (a
// signal: the worker leaves) and an *ExitError with code 1 when the head
// refuses it, cannot be reached within the join timeout, or goes away.
// The simulated memory is freed on return.
func (w *GroupWorker) Run(ctx context.Context) error {
	defer w.mem.freeAll()
	conn, rd, err := w.join(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		w.logf(LevelError, "%v", err)
		return &ExitError{Code: 1, Reason: err.Error()}
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	fail := func(format string, a ...any) error {
		if ctx.Err() != nil {
			return nil
		}
		msg := fmt.Sprintf(format, a...)
		w.logf(LevelError, "%s", msg)
		return &ExitError{Code: 1, Reason: msg}
	}
	// Wait for every rank, then load.
	if line, err := rd.ReadString('\n'); err != nil || strings.TrimSpace(line) != "load" {
		return fail("%s", w.cfg.lostLine(0))
	}
	if err := w.cfg.checkNet(); err != nil {
		return fail("%v", err)
	}
	if err := w.load(); err != nil {
		return fail("%v", err)
	}
	if _, err := fmt.Fprintf(conn, "loaded\n"); err != nil {
		return fail("%s", w.cfg.lostLine(0))
	}
	if line, err := rd.ReadString('\n'); err != nil || strings.TrimSpace(line) != "serving" {
		return fail("%s", w.cfg.lostLine(0))
	}
	w.logf(LevelInfo, "group rank %d of %d: serving with the head", w.cfg.Rank, w.cfg.Size)
	close(w.joined)
	lost := func() error {
		if w.cfg.PeerLoss == PeerLossHang && ctx.Err() == nil {
			// Nothing tells this rank its head is gone: it waits for
			// the head's next broadcast, holding its memory, until it
			// is stopped. The line is the fake's own, for tests.
			w.logf(LevelInfo, "fake: group rank %d: the head's connection closed; the engine does not notice and waits", w.cfg.Rank)
			<-ctx.Done()
			return nil
		}
		return fail("%s", w.cfg.lostLine(0))
	}
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			return lost()
		}
		if _, err := fmt.Fprintf(conn, "%s\n", w.do(strings.TrimSpace(line))); err != nil {
			return lost()
		}
	}
}

// Asleep reports whether the worker has released memory on the head's
// command (sleep) and not woken all of it.
func (w *GroupWorker) Asleep() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.asleep
}

// do carries out one command of the head and returns the answer.
func (w *GroupWorker) do(line string) string {
	f := strings.Fields(line)
	if len(f) == 0 {
		return "error empty command"
	}
	var err error
	var answer string
	switch f[0] {
	case "sleep":
		answer = "slept"
		level := 0
		if len(f) > 1 {
			level, err = strconv.Atoi(f[1])
		}
		if err != nil || level < 1 || len(f) < 3 {
			return fmt.Sprintf("error bad command %q: want sleep <level> <tag>...", line)
		}
		err = w.sleep(level, f[2:])
	case "wake":
		answer = "woke"
		if len(f) < 2 {
			return fmt.Sprintf("error bad command %q: want wake <tag>...", line)
		}
		err = w.wake(f[1:])
	case "reload":
		answer = "reloaded"
		err = w.reload()
	default:
		return fmt.Sprintf("error unknown command %q", line)
	}
	if err != nil {
		w.logf(LevelError, "group rank %d: %s: %v", w.cfg.Rank, f[0], err)
		return "error " + strings.ReplaceAll(err.Error(), "\n", " ")
	}
	return answer
}

// sleep releases tags from the worker's card, as Engine.Park does for a
// head or a single engine: the first sleep of a cycle then takes the park
// residue (what a rank keeps on its card asleep: its CUDA context), and a
// second one releases what is still held.
func (w *GroupWorker) sleep(level int, tags []string) error {
	tags, err := memoryTags("sleep", tags)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, t := range tags {
		if w.parked[t] {
			continue
		}
		if err := w.mem.free(t); err != nil {
			return err
		}
		w.parked[t] = true
	}
	if !w.asleep {
		// What the rank keeps of what it released, as Engine.Park.
		if err := w.mem.alloc(TagParkResidue, w.mem.cfg.ParkResidue); err != nil {
			return fmt.Errorf("park residue: %w", err)
		}
		w.asleep = true
	}
	w.logf(LevelInfo, "group rank %d asleep (level %d): released %v", w.cfg.Rank, level, tags)
	return nil
}

// wake takes tags back on the worker's card, as Engine.Wake does; once
// nothing is left released the residue is freed. An out-of-memory leaves
// the tag released.
func (w *GroupWorker) wake(tags []string) error {
	tags, err := memoryTags("wake", tags)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.asleep {
		return nil
	}
	sizes := map[string]int64{TagWeights: w.mem.cfg.Weights, TagKVCache: w.mem.cfg.KV}
	for _, t := range tags {
		if !w.parked[t] {
			continue
		}
		if err := w.mem.alloc(t, sizes[t]); err != nil {
			return fmt.Errorf("wake %s: %w", t, err)
		}
		delete(w.parked, t)
	}
	if len(w.parked) > 0 {
		w.logf(LevelInfo, "group rank %d: woke %v", w.cfg.Rank, tags)
		return nil
	}
	if err := w.mem.free(TagParkResidue); err != nil {
		return err
	}
	w.asleep = false
	w.logf(LevelInfo, "group rank %d awake", w.cfg.Rank)
	return nil
}

// reload reloads the worker's share of the weights: refused while they
// sleep, as the head refuses it.
func (w *GroupWorker) reload() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.parked[TagWeights] {
		return errors.New("cannot reload weights while they sleep: wake_up?tags=weights first")
	}
	w.logf(LevelInfo, "group rank %d: reloaded its share of the weights", w.cfg.Rank)
	return nil
}

// join connects to the head, retrying refused connections until the join
// timeout, and says hello.
func (w *GroupWorker) join(ctx context.Context) (net.Conn, *bufio.Reader, error) {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.joinTimeout())
	defer cancel()
	w.logf(LevelInfo, "group rank %d of %d: joining the head at %s", w.cfg.Rank, w.cfg.Size, w.cfg.Addr)
	var d net.Dialer
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		c, err := d.DialContext(ctx, "tcp", w.cfg.Addr)
		if err == nil {
			deadline, _ := ctx.Deadline()
			_ = c.SetDeadline(deadline)
			rd := bufio.NewReader(c)
			if _, err := fmt.Fprintf(c, "%s hello engine=%s rank=%d nnodes=%d\n", GroupProtocol, w.cfg.Engine, w.cfg.Rank, w.cfg.Size); err != nil {
				c.Close()
				return nil, nil, fmt.Errorf("group rendezvous with %s: %w", w.cfg.Addr, err)
			}
			line, err := rd.ReadString('\n')
			line = strings.TrimSpace(line)
			switch {
			case err != nil:
				c.Close()
				return nil, nil, fmt.Errorf("group rendezvous with %s: %w", w.cfg.Addr, err)
			case line != "ok":
				c.Close()
				return nil, nil, fmt.Errorf("group rendezvous with %s: %s", w.cfg.Addr, line)
			}
			_ = c.SetDeadline(time.Time{})
			return c, rd, nil
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil, nil, fmt.Errorf("group rendezvous: head %s unreachable for %s: %w", w.cfg.Addr, w.cfg.joinTimeout(), err)
			}
			return nil, nil, ctx.Err()
		case <-tick.C:
		}
	}
}

// load takes the worker's share on its simulated card: weights, then the
// KV cache (the startup peak is held only while loading).
func (w *GroupWorker) load() error {
	if !w.mem.enabled() {
		return nil
	}
	if err := w.mem.open(); err != nil {
		return fmt.Errorf("simulated gpu: %w", err)
	}
	w.logf(LevelInfo, "using simulated device %d (%s)", w.mem.dev.Index, w.mem.dev.UUID)
	if err := w.mem.startCheck(); err != nil {
		return err
	}
	for _, s := range []struct {
		tag string
		n   int64
	}{{TagWeights, w.mem.cfg.Weights}, {TagStartupPeak, w.mem.cfg.StartupPeak}, {TagKVCache, w.mem.cfg.KV}} {
		if err := w.mem.alloc(s.tag, s.n); err != nil {
			w.mem.freeAll()
			return fmt.Errorf("allocate %s: %w", s.tag, err)
		}
		if s.n > 0 {
			w.logf(LevelInfo, "allocated %s for %s", FormatBytes(s.n), s.tag)
		}
	}
	return w.mem.free(TagStartupPeak)
}
