// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pluginmgr

import (
	"context"
	"errors"
	"time"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk"
)

// Deadlines bound every driver call by its kind, and set how drivers are
// pinged. A zero field takes its default (DefaultDeadlines). They are the
// role's drivers.* settings.
type Deadlines struct {
	// Call bounds the quick calls: Describe, Flags, Load, Logs, Abort and
	// liveness probes (default 15s). A readiness probe gets its own wait
	// (the request's deadline_ms) plus Call.
	Call time.Duration
	// Plan bounds Plan, Detect (which may run the engine's interpreter)
	// and Recover (default 1m).
	Plan time.Duration
	// Start bounds Start: spawning the engine behind its launch shim and
	// proving what runs (default 2m). Readiness is a probe, not Start.
	Start time.Duration
	// Park bounds Park and Wake, which move a model's memory (default 5m).
	Park time.Duration
	// Stop bounds Stop on top of the request's grace period (default 30s).
	Stop time.Duration
	// PingInterval is how often every driver is pinged (default 5s);
	// PingTimeout bounds one ping (default 5s). A driver that misses
	// PingFailures pings in a row (default 2) is killed and relaunched.
	PingInterval time.Duration
	PingTimeout  time.Duration
	PingFailures int
}

// DefaultDeadlines are the defaults of Deadlines.
var DefaultDeadlines = Deadlines{
	Call: 15 * time.Second, Plan: time.Minute, Start: 2 * time.Minute, Park: 5 * time.Minute, Stop: 30 * time.Second,
	PingInterval: 5 * time.Second, PingTimeout: 5 * time.Second, PingFailures: 2,
}

func (d Deadlines) withDefaults() Deadlines {
	def := DefaultDeadlines
	set := func(v *time.Duration, dv time.Duration) {
		if *v <= 0 {
			*v = dv
		}
	}
	set(&d.Call, def.Call)
	set(&d.Plan, def.Plan)
	set(&d.Start, def.Start)
	set(&d.Park, def.Park)
	set(&d.Stop, def.Stop)
	set(&d.PingInterval, def.PingInterval)
	set(&d.PingTimeout, def.PingTimeout)
	if d.PingFailures <= 0 {
		d.PingFailures = def.PingFailures
	}
	return d
}

// errDeadline is the cause of a context cut by a call's own deadline.
var errDeadline = errors.New("driver call deadline")

// bound returns the deadline of one call of method with request req: by
// kind, plus the grace a Stop grants or the wait a readiness probe asks.
func (d Deadlines) bound(method string, req any) time.Duration {
	switch kindSetting(method) {
	case "plan":
		return d.Plan
	case "start":
		return d.Start
	case "park":
		return d.Park
	case "stop":
		if r, ok := req.(*sdk.StopRequest); ok && r.Grace > 0 {
			return d.Stop + r.Grace
		}
		return d.Stop
	}
	if r, ok := req.(*sdk.ProbeRequest); ok && r.Deadline > 0 {
		return d.Call + r.Deadline
	}
	return d.Call
}

// withDeadline bounds ctx by the call's deadline. The returned check turns
// an error of a call cut by that deadline (not by the caller's own context)
// into driver_timeout.
func withDeadline(ctx context.Context, family, method string, bound time.Duration) (context.Context, context.CancelFunc, func(error) error) {
	cctx, cancel := context.WithTimeoutCause(ctx, bound, errDeadline)
	check := func(err error) error {
		if err == nil || ctx.Err() != nil || !errors.Is(context.Cause(cctx), errDeadline) {
			return err
		}
		return codedErr(structs.CodeDriverTimeout, err,
			"the %s driver did not answer %s within %s (drivers.%s_timeout)", family, method, bound, kindSetting(method))
	}
	return cctx, cancel, check
}

// kindSetting names the drivers.* setting that bounds a method.
func kindSetting(method string) string {
	switch method {
	case "Plan", "Detect", "Recover":
		return "plan"
	case "Start":
		return "start"
	case "Park", "Wake":
		return "park"
	case "Stop":
		return "stop"
	}
	return "call"
}

// codedErr is a catalogue error that also carries its code as an sdk.Error
// in its chain: the core reads driver errors with either structs.AsError or
// sdk.CodeOf, and both must see the code.
func codedErr(code structs.Code, cause error, format string, args ...any) error {
	e := structs.Wrap(code, cause, format, args...)
	e.Cause = &sdk.Error{Code: string(code), Message: e.Message}
	return e
}
