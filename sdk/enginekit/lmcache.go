// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package enginekit

import (
	"time"

	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/proc"
)

// An instance's private LMCache server is a launch of its own: its own
// shim, process group and launch directory, started beside the engine's
// launch. IMPORTANT: it belongs to the instance, not to one engine launch,
// so that a restart_only park (which stops the engine) keeps the cache and
// the next engine launch reconnects to it on the same port. The core
// records it with the instance (LaunchContext.lmcache_server) and ends it
// by naming it in a Stop (StopRequest.lmcache_server).

// RoleLMCache is the role of an LMCache server among a launch's recorded
// processes.
const RoleLMCache = "lmcache"

// lmcacheStopGrace is how long the LMCache server may take after SIGTERM:
// it holds nothing that must be flushed.
const lmcacheStopGrace = 5 * time.Second

// StartLMCacheServer returns the instance's LMCache server for a Start:
// nil when the plan runs none; the recorded one (LaunchContext.
// lmcache_server) when its server process still runs; else a new launch
// of the plan's server command in the recorded launch directory, on the
// leased port, which must be free. started says the server is new (a
// caller whose engine launch then fails ends it: StopLMCacheServer).
func StartLMCacheServer(o LaunchOptions) (server *proc.Launched, started bool, err error) {
	p := &o.Plan.LMCache
	if !p.Runs {
		return nil, false, nil
	}
	lctx := o.Launch
	rec := lctx.LMCacheServer
	port := int(lctx.LMCachePort)
	if port <= 0 || rec == nil || rec.LaunchDir == "" || len(p.Argv) == 0 {
		return nil, false, sdk.Errorf(sdk.CodeLaunchFailed, "the plan runs LMCache but has no leased LMCache port, server directory or command")
	}
	if int(rec.Port) != 0 && int(rec.Port) != port {
		return nil, false, sdk.Errorf(sdk.CodeLaunchFailed, "the LMCache server is recorded on port %d, the launch renders port %d", rec.Port, port)
	}
	if l := lmcacheLaunched(rec); l.Pgid != 0 {
		if proc.Alive(l.Engine) {
			return &l, false, nil // the instance's cache, kept across a park
		}
		// A server that died: what is left of its group ends before the
		// port is used again.
		if res := StopLaunch(l, lmcacheStopGrace); !res.Gone {
			return nil, false, sdk.Errorf(sdk.CodeLaunchFailed, "the instance's earlier LMCache server could not be proven gone: %s", res.Detail)
		}
	}
	if !proc.PortFree(port) {
		return nil, false, sdk.Errorf(CodePortConflict, "another process listens on the leased LMCache port %d", port)
	}
	launched, err := proc.Start(proc.LaunchSpec{
		Argv:         p.Argv,
		Env:          p.Env,
		LaunchDir:    rec.LaunchDir,
		LogMode:      LogMode(o.Host),
		NoCoreDumps:  o.Host.Retention == "zero",
		NetNamespace: o.NetNamespace,
	})
	if err != nil {
		return nil, false, sdk.Errorf(sdk.CodeLaunchFailed, "launch the LMCache server: %v", err)
	}
	return launched, true, nil
}

// StopLMCacheServer ends a recorded LMCache server and proves it gone; a
// record with no processes (none was ever started) is gone already.
func StopLMCacheServer(rec *sdk.Launch) *sdk.StopResponse {
	l := lmcacheLaunched(rec)
	if l.Pgid == 0 {
		return &sdk.StopResponse{Gone: true, ExitCode: -1, Detail: "no LMCache server was started"}
	}
	return StopLaunch(l, lmcacheStopGrace)
}

// LMCacheServerRecord is the record of a server launch on port.
func LMCacheServerRecord(l *proc.Launched, port int, launchID string) *sdk.Launch {
	if l == nil {
		return nil
	}
	return &sdk.Launch{
		Pgid: int32(l.Pgid), LaunchDir: l.LaunchDir, Port: int32(port), LaunchID: launchID,
		Processes: []*sdk.ProcessIdentity{
			{Pid: int32(l.Shim.PID), StartTicks: l.Shim.StartTicks, Role: "shim"},
			{Pid: int32(l.Engine.PID), StartTicks: l.Engine.StartTicks, Role: RoleLMCache},
		},
	}
}

// lmcacheLaunched is a recorded server launch as proc sees it (the server
// is the launch's main process), read back from its directory when the
// record has no identities (a driver that failed before answering).
func lmcacheLaunched(rec *sdk.Launch) proc.Launched {
	if rec == nil {
		return proc.Launched{}
	}
	out := proc.Launched{Pgid: int(rec.Pgid), LaunchDir: rec.LaunchDir}
	for _, p := range rec.Processes {
		id := proc.Identity{PID: int(p.Pid), StartTicks: p.StartTicks}
		switch p.Role {
		case "shim":
			out.Shim = id
		case RoleLMCache, "engine":
			out.Engine = id
		}
	}
	if out.Pgid == 0 && rec.LaunchDir != "" {
		if fromDir, err := proc.ReadLaunched(rec.LaunchDir); err == nil {
			out = fromDir
		}
	}
	return out
}

// StartWithLMCache starts the instance's LMCache server where the plan
// runs one (StartLMCacheServer), then the engine's launch (StartLaunch)
// connected to it. A server started here for an engine launch that fails
// is ended again; a kept one stays the instance's. server is the record to
// answer in StartResponse.lmcache_server, nil without LMCache.
func StartWithLMCache(o LaunchOptions) (launched *proc.Launched, server *sdk.Launch, err error) {
	srv, started, err := StartLMCacheServer(o)
	if err != nil {
		return nil, nil, err
	}
	o.LMCacheServer = srv
	launched, err = StartLaunch(o)
	if err != nil {
		if started {
			_ = StopLaunch(*srv, lmcacheStopGrace)
		}
		return nil, nil, err
	}
	if srv != nil {
		rec := o.Launch.LMCacheServer
		server = LMCacheServerRecord(srv, int(o.Launch.LMCachePort), rec.LaunchID)
	}
	return launched, server, nil
}
