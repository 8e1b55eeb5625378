// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pluginmgr

import (
	"context"
	"sync"
	"syscall"
	"time"

	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc/health/grpc_health_v1"

	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/sdk/proc"
)

// killGrace is how long a driver is given to end after go-plugin's graceful
// shutdown before it is killed.
const killGrace = 5 * time.Second

// Watch supervises the drivers until ctx ends: a driver that exited is
// relaunched promptly instead of at the next call, and every driver is
// pinged; one that misses Deadlines.PingFailures pings in a row (hung,
// stopped with SIGSTOP, deadlocked) is killed and relaunched like a crashed
// one. Its engines keep running behind their launch shims and the
// relaunched driver recovers them (Config.OnRelaunch).
//
// Watch returns once the pings and relaunches it started have ended.
func (m *Manager) Watch(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var work sync.WaitGroup
	defer work.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.mu.Lock()
		procs := make([]*driverProc, 0, len(m.drivers))
		for _, d := range m.drivers {
			procs = append(procs, d)
		}
		closed := m.closed
		m.mu.Unlock()
		if closed {
			return
		}
		now := time.Now()
		for _, d := range procs {
			d.mu.Lock()
			dead := d.client != nil && d.client.Exited() && d.launching == nil
			ping := !dead && d.conn != nil && d.launching == nil && !d.pinging && now.Sub(d.lastPing) >= m.cfg.Deadlines.PingInterval
			if ping {
				d.pinging, d.lastPing = true, now
			}
			d.mu.Unlock()
			switch {
			case dead:
				m.logger.Warn("driver exited; relaunching", "driver", d.family)
				work.Add(1)
				go func(d *driverProc) {
					defer work.Done()
					lctx, cancel := context.WithTimeout(ctx, time.Minute)
					defer cancel()
					if _, err := d.ensure(lctx, m); err != nil {
						m.logger.Error("driver relaunch failed", "driver", d.family, "error", err)
					}
				}(d)
			case ping:
				work.Add(1)
				go func(d *driverProc) {
					defer work.Done()
					m.ping(ctx, d)
				}(d)
			}
		}
	}
}

// ping checks that a driver answers (go-plugin's health service, the call
// behind Client.Ping, but bounded: Ping itself has no deadline and would
// wait forever on a stopped process).
func (m *Manager) ping(ctx context.Context, d *driverProc) {
	d.mu.Lock()
	conn, client, pid, ticks := d.conn, d.client, d.pid, d.ticks
	d.mu.Unlock()
	pctx, cancel := context.WithTimeout(ctx, m.cfg.Deadlines.PingTimeout)
	_, err := grpc_health_v1.NewHealthClient(conn).Check(pctx, &grpc_health_v1.HealthCheckRequest{Service: goplugin.GRPCServiceName})
	cancel()

	d.mu.Lock()
	d.pinging = false
	if d.client != client || ctx.Err() != nil {
		// Relaunched meanwhile, or the supervisor is stopping.
		d.mu.Unlock()
		return
	}
	if err == nil {
		d.pingFailures = 0
		d.mu.Unlock()
		return
	}
	d.pingFailures++
	failures := d.pingFailures
	d.mu.Unlock()
	m.logger.Warn("driver did not answer a ping", "driver", d.family, "pid", pid, "missed", failures, "error", err)
	if failures < m.cfg.Deadlines.PingFailures {
		return
	}
	m.logger.Error("driver stopped answering; killing it to relaunch", "driver", d.family, "pid", pid)
	// The kill makes the client exit; the next Watch tick relaunches.
	killPID(pid, ticks)
}

// killPID sends SIGKILL to a driver process if it is still the one started
// at ticks (never to a recycled PID). SIGKILL also ends a stopped process.
func killPID(pid int, ticks uint64) bool {
	if pid <= 0 || ticks == 0 {
		return false
	}
	if now, err := proc.ReadStartTicks(pid); err != nil || now != ticks {
		return false
	}
	return syscall.Kill(pid, syscall.SIGKILL) == nil
}

// endClient ends a driver through go-plugin (a graceful shutdown RPC, then a
// kill) but never waits on it past killGrace: go-plugin's Kill waits for an
// answer to its shutdown RPC as long as the process lives, forever for a
// stopped one. Past the grace the process is killed, which ends the wait.
func (m *Manager) endClient(family string, c *goplugin.Client, pid int, ticks uint64) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Kill()
	}()
	select {
	case <-done:
		return
	case <-time.After(killGrace):
	}
	m.logger.Warn("driver did not end; killing it", "driver", family, "pid", pid)
	killPID(pid, ticks)
	select {
	case <-done:
	case <-time.After(killGrace):
		m.logger.Error("driver client did not end after the kill", "driver", family, "pid", pid)
	}
}

// endStray ends a recorded driver process this core could not re-attach to
// (it hangs, or speaks what this core cannot), forgets its record and
// removes its socket. IMPORTANT: it is ours to end: the record comes from
// this state directory's store, which only one core opens at a time, and
// its start time matches. Its engines survive it (they run behind their
// launch shims) and are recovered by the next driver of the family.
func (m *Manager) endStray(rec *store.ReattachRecord) {
	if killPID(rec.Pid, rec.StartTicks) {
		m.logger.Warn("ended a recorded driver that could not be re-attached", "driver", rec.Driver, "pid", rec.Pid)
	}
	if m.cfg.Store != nil {
		_ = m.cfg.Store.DeleteReattach(rec.Driver)
	}
	m.removeSocket(rec.Network, rec.Addr)
}

// AdoptRecorded re-attaches to every driver the store records that is not
// attached yet: after a crash of the core, drivers without running
// instances (say the vLLM driver of on-demand models, launched for
// `engine flags`) are otherwise never re-attached, and outlive the next
// clean stop under PID 1, one more after every crash. A recorded driver that
// cannot be re-attached is ended. Adopted drivers are supervised and ended
// by Shutdown like launched ones.
func (m *Manager) AdoptRecorded(ctx context.Context) {
	if m.cfg.Store == nil {
		return
	}
	recs, err := m.cfg.Store.ListReattach()
	if err != nil {
		m.logger.Warn("could not list recorded drivers", "error", err)
		return
	}
	for i := range recs {
		rec := &recs[i]
		d, err := m.proc(rec.Driver)
		if err != nil {
			// No such family any more (an external driver removed), or
			// shutting down: nobody will use the process; end it.
			m.endStray(rec)
			continue
		}
		d.mu.Lock()
		busy := d.client != nil || d.launching != nil
		if busy {
			d.mu.Unlock()
			continue
		}
		ch := make(chan struct{})
		d.launching = ch
		d.mu.Unlock()
		err = m.reattach(ctx, d, rec)
		d.mu.Lock()
		d.launching = nil
		d.mu.Unlock()
		close(ch)
		if err != nil {
			m.logger.Warn("could not re-attach to a recorded driver; ending it", "driver", rec.Driver, "pid", rec.Pid, "error", err)
			m.endStray(rec)
			continue
		}
		m.logger.Info("re-attached to a recorded driver", "driver", rec.Driver, "pid", rec.Pid)
	}
	m.endUnrecorded()
}

// Shutdown ends every driver and forgets their reattach configs (a clean
// stop; engines keep running in their own process groups and the next core
// launches fresh drivers and recovers them). With detach, drivers are left
// running and their reattach configs kept, as after a crash. A driver that
// does not end within killGrace (a stopped one) is killed.
func (m *Manager) Shutdown(detach bool) {
	m.mu.Lock()
	m.closed = true
	procs := make([]*driverProc, 0, len(m.drivers))
	for _, d := range m.drivers {
		procs = append(procs, d)
	}
	m.mu.Unlock()
	var wg sync.WaitGroup
	for _, d := range procs {
		d.mu.Lock()
		c, pid, ticks, addr := d.client, d.pid, d.ticks, d.addr
		d.mu.Unlock()
		if c == nil || detach {
			continue
		}
		wg.Add(1)
		go func(d *driverProc, c *goplugin.Client) {
			defer wg.Done()
			m.endClient(d.family, c, pid, ticks)
			if m.cfg.Store != nil {
				_ = m.cfg.Store.DeleteReattach(d.family)
			}
			m.removeSocket("unix", addr)
		}(d, c)
	}
	wg.Wait()
	// The OnRelaunch calls in flight end before the manager is done.
	m.callbacks.Wait()
	if !detach {
		m.removeFallbackDir()
	}
}
