// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakecli

import (
	"context"
	"fmt"
	"io"
	"net"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
)

// lmcacheModule is LMCache's standalone server module.
const lmcacheModule = "lmcache.v1.server"

// lmcacheInvocation is `python -m lmcache.v1.server <host> <port> [device]`
// (lmcache/v1/server/__main__.py; the console script lmcache_server runs
// the same main): the fake LMCache server of fakeengine.LMCacheServer.
var lmcacheInvocation = invocation{
	usage: "python -m " + lmcacheModule + " <host> <port> [cpu]   (LMCache's standalone server)",
	match: func(prog, module string, args []string) bool { return module == lmcacheModule },
	run: func(args []string, env func(string) string, stdout, stderr io.Writer) int {
		return lmcacheServerCommand(afterModule(args), stdout, stderr)
	},
}

// lmcacheServerCommand serves the fake LMCache until SIGTERM or SIGINT.
// Like the real main it takes exactly a host, a port and an optional
// storage device, and exits 1 on anything else.
func lmcacheServerCommand(args []string, stdout, stderr io.Writer) int {
	if len(args) != 2 && len(args) != 3 {
		fmt.Fprintf(stderr, "[lmcache] ERROR Usage: lmcache_server <host> <port> <storage>(default:cpu)\n")
		return 1
	}
	port, err := strconv.Atoi(args[1])
	if err != nil {
		fmt.Fprintf(stderr, "ValueError: invalid literal for int() with base 10: '%s'\n", args[1])
		return 1
	}
	if len(args) == 3 && args[2] != "cpu" {
		fmt.Fprintf(stderr, "[lmcache] ERROR the fake LMCache server stores on cpu only, not %q\n", args[2])
		return 1
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(args[0], strconv.Itoa(port)))
	if err != nil {
		fmt.Fprintf(stderr, "OSError: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	fmt.Fprintf(stdout, "[lmcache] INFO Server started at %s:%d\n", args[0], port)
	srv := fakeengine.NewLMCacheServer()
	if err := srv.Serve(ln); err != nil {
		fmt.Fprintf(stderr, "[lmcache] ERROR %v\n", err)
		return 1
	}
	n, puts, hits := srv.Stats()
	fmt.Fprintf(stdout, "[lmcache] INFO stopping: %d chunks stored, %d puts, %d hits\n", n, puts, hits)
	return 0
}

// lmcacheDialWait bounds how long an engine waits for its LMCache server
// to listen (the server starts just before the engine).
const lmcacheDialWait = 20 * time.Second

// connectLMCache is an engine's LMCache connector from LMCache's
// variables: LMCACHE_REMOTE_URL (required: the fake has no local-only
// cache) and LMCACHE_CHUNK_SIZE, and from PYTHONHASHSEED, which fixes the
// seed its chunk keys chain from (random per process when unset). It waits
// for the server to answer.
func connectLMCache(env func(string) string) (*fakeengine.LMCacheClient, error) {
	remote := env("LMCACHE_REMOTE_URL")
	if remote == "" {
		return nil, fmt.Errorf("LMCache is enabled but LMCACHE_REMOTE_URL is not set (the fake LMCache connector needs its server)")
	}
	chunk := 0
	if s := env("LMCACHE_CHUNK_SIZE"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("LMCACHE_CHUNK_SIZE %q: want a positive integer", s)
		}
		chunk = n
	}
	seed, err := fakeengine.NoneHash(env("PYTHONHASHSEED"))
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(lmcacheDialWait)
	for {
		c, err := fakeengine.DialLMCache(remote, chunk, seed)
		if err == nil || time.Now().After(deadline) {
			return c, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}
