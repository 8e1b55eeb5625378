// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakecli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
)

// Group mode of the engine flavours: the same argv a real engine gets for
// a multi-node launch (vLLM's --nnodes/--node-rank/--master-addr/
// --master-port with --headless workers, SGLang's --nnodes/--node-rank/
// --dist-init-addr, TensorFold's --tp 2/--rank/--master/--master-port)
// puts the fake in a group; fakeengine/group.go has the rendezvous.

// rdmaDirEnv names the directory the fake reads as the machine's RDMA
// devices (fakeengine.DefaultRDMADir when unset), so that a test can give a
// rank a machine with or without one.
const rdmaDirEnv = "CAPYCTL_FAKE_RDMA_DIR"

// groupJoinTimeoutEnv overrides fakeengine.DefaultGroupJoinTimeout (a Go
// duration), so that a test of an unreachable head ends quickly.
const groupJoinTimeoutEnv = "CAPYCTL_FAKE_GROUP_JOIN_TIMEOUT"

// groupLaunch is a parsed group launch of one rank.
type groupLaunch struct {
	// engine is the family.
	engine string
	// rank is the node rank, size the number of nodes.
	rank, size int
	// addr is the head's rendezvous address.
	addr string
	// lostLog is what a survivor logs (see fakeengine.GroupConfig).
	lostLog string
	// peerLoss is what a survivor does; under fakeengine.PeerLossHang,
	// timeoutEnv names the engine's variable (in seconds) that bounds a
	// collective waiting for a lost rank, and stuckLog is what the engine
	// logs when it gives up.
	peerLoss   fakeengine.PeerLoss
	timeoutEnv string
	stuckLog   string
}

// config is the launch's fakeengine.GroupConfig; the head binds its
// rendezvous listener here, before anything loads, so that a busy port
// fails the launch at once.
func (g groupLaunch) config(env func(string) string) (*fakeengine.GroupConfig, error) {
	cfg := &fakeengine.GroupConfig{Engine: g.engine, Rank: g.rank, Size: g.size, Addr: g.addr, LostLog: g.lostLog,
		PeerLoss: g.peerLoss, StuckLog: g.stuckLog, NCCLNet: env("NCCL_NET"), RDMADir: env(rdmaDirEnv)}
	if g.timeoutEnv != "" {
		if s := env(g.timeoutEnv); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n <= 0 {
				return nil, fmt.Errorf("ValueError: invalid literal for int() with base 10: '%s' (%s)", s, g.timeoutEnv)
			}
			cfg.CollectiveTimeout = time.Duration(n) * time.Second
		}
	}
	if s := env(groupJoinTimeoutEnv); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("%s=%q: want a positive duration", groupJoinTimeoutEnv, s)
		}
		cfg.JoinTimeout = d
	}
	if g.rank == 0 {
		ln, err := net.Listen("tcp", g.addr)
		if err != nil {
			return nil, fmt.Errorf("group rendezvous: %w", err)
		}
		cfg.Listener = ln
	}
	return cfg, nil
}

// share is a rank's part of what a model needs in all: n split over the
// group's machines, as the real engines split the weights over
// tensor_parallel × pipeline_parallel ranks (one card per machine).
func share(n int64, machines int) int64 {
	if machines <= 1 {
		return n
	}
	return (n + int64(machines) - 1) / int64(machines)
}

// parallelFits checks that the machines divide tp × pp.
func parallelFits(tp, pp, machines int) error {
	if tp < 1 || pp < 1 {
		return fmt.Errorf("parallel sizes %d × %d must be at least 1", tp, pp)
	}
	if (tp*pp)%machines != 0 {
		return fmt.Errorf("tensor_parallel %d × pipeline_parallel %d does not divide over %d machines", tp, pp, machines)
	}
	return nil
}

// runGroupWorker runs a worker rank until a signal (exit 0) or its failure
// (exit 1). With healthAddr set it serves, once the worker is ready, the
// routes health answers: SGLang's non-zero ranks run a "dummy health
// check server" on their --host and --port; vLLM's headless ranks and
// TensorFold's rank 1 run none.
func runGroupWorker(g *fakeengine.GroupConfig, sim fakeengine.SimConfig, logf func(fakeengine.Level, string, ...any), healthAddr string, health http.Handler, stderr io.Writer) int {
	w, err := fakeengine.NewGroupWorker(*g, sim, logf)
	if err != nil {
		fmt.Fprintf(stderr, "capyctl-fake-engine: %v\n", err)
		return 2
	}
	var ln net.Listener
	if healthAddr != "" {
		// Bound first, listening once ready: refused until then, as the
		// real server starts only after the schedulers are ready.
		if ln, err = fakeengine.Listen("tcp", healthAddr); err != nil {
			fmt.Fprintf(stderr, "capyctl-fake-engine: %v\n", err)
			return 1
		}
		defer ln.Close()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	served := make(chan struct{})
	go func() {
		defer close(served)
		select {
		case <-w.Ready():
		case <-runCtx.Done():
			return
		}
		if ln == nil {
			return
		}
		logf(fakeengine.LevelInfo, "health check server listening on %s", ln.Addr())
		srv := &http.Server{Handler: health, ReadHeaderTimeout: 10 * time.Second}
		_ = srv.Serve(ln)
	}()
	err = w.Run(runCtx)
	cancel()
	if ln != nil {
		ln.Close()
	}
	<-served
	var x *fakeengine.ExitError
	if errors.As(err, &x) {
		return x.Code
	}
	if err != nil {
		fmt.Fprintf(stderr, "capyctl-fake-engine: %v\n", err)
		return 1
	}
	logf(fakeengine.LevelInfo, "group rank %d stopped", g.Rank)
	return 0
}

// hostPort joins a host and a port number.
func hostPort(host string, port int) string { return net.JoinHostPort(host, strconv.Itoa(port)) }
