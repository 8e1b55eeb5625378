// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import "time"

// Requests is what the lifecycle reads of the requests admitted to its
// instances before it drains, parks, switches or idles one, and what it
// tells about a launch that ended. The admission controller the agent
// builds, and hands to the router too, implements it; the lifecycle never
// waits on it for long. Switching and draining wait for Active to reach
// zero (requests being served, and cut requests the engine may still be
// working on that its load reading or an abort will settle); they never
// wait for SettleAtStop, which only the instance's next stop settles: a
// model that would park with such requests stops instead.
type Requests interface {
	// Active is the number of requests admitted to an instance that the
	// engine may still be working on.
	Active(instance string) int
	// SettleAtStop is the number of cut requests of an instance that settle
	// only when the engine stops.
	SettleAtStop(instance string) int
	// Waiting is the number of requests queued for a deployment.
	Waiting(deployment string) int
	// Stopped says that the launches of an instance up to generation have
	// ended (stopped, restarted, exited): every cut request they held is
	// settled.
	Stopped(instance string, generation uint64)
}

// noRequests is the Requests of a lifecycle without admission (tests).
type noRequests struct{}

func (noRequests) Active(string) int       { return 0 }
func (noRequests) SettleAtStop(string) int { return 0 }
func (noRequests) Waiting(string) int      { return 0 }
func (noRequests) Stopped(string, uint64)  {}

// lastUsedAt returns when a request last used the instance (the router
// records it on the instance's route target).
func (in *instance) lastUsedAt() time.Time {
	n := in.lastUsed.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}
