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

	// The turns of models that compete for one card (turns.go): a switch
	// asks the model in its way to end its turn and waits for the channel
	// that says it ended; the model serves what waits in its line, then
	// admits nothing until Reopen (the lifecycle reopens a deployment when
	// one of its instances is ready, or when the switch gives up on it).

	// OldestWaiting is when a deployment's longest-waiting request arrived.
	OldestWaiting(deployment string) (time.Time, bool)
	// Contend asks a deployment to end its turn, at most requests more
	// admitted (0: no bound), once idle after linger without a new request;
	// the channel closes when the turn ended.
	Contend(deployment string, requests int, linger time.Duration) <-chan struct{}
	// CloseTurn ends a contended turn now (its time ran out).
	CloseTurn(deployment string)
	// TurnEnded says why a deployment's last contended turn ended and how
	// many requests it admitted after it was contended.
	TurnEnded(deployment string) (why string, served int)
	// Reopen lets a deployment admit again.
	Reopen(deployment string)
	// ServiceTime is how long a request of a deployment holds a place, on
	// average (0 when unknown); Places its running places per instance.
	ServiceTime(deployment string) time.Duration
	Places(deployment string) int
	// ArrivalRate is a deployment's recent requests per second (0 when
	// unknown): how soon an evicted model is likely to be asked for again.
	ArrivalRate(deployment string) float64
}

// noRequests is the Requests of a lifecycle without admission (tests).
type noRequests struct{}

func (noRequests) Active(string) int                                  { return 0 }
func (noRequests) SettleAtStop(string) int                            { return 0 }
func (noRequests) Waiting(string) int                                 { return 0 }
func (noRequests) Stopped(string, uint64)                             {}
func (noRequests) OldestWaiting(string) (time.Time, bool)             { return time.Time{}, false }
func (noRequests) Contend(string, int, time.Duration) <-chan struct{} { return closedChan }
func (noRequests) CloseTurn(string)                                   {}
func (noRequests) TurnEnded(string) (string, int)                     { return "", 0 }
func (noRequests) Reopen(string)                                      {}
func (noRequests) ServiceTime(string) time.Duration                   { return 0 }
func (noRequests) Places(string) int                                  { return 1 }
func (noRequests) ArrivalRate(string) float64                         { return 0 }

// closedChan is a closed channel (a turn that ended at once).
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// lastUsedAt returns when a request last used the instance (the router
// records it on the instance's route target).
func (in *instance) lastUsedAt() time.Time {
	n := in.lastUsed.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}
