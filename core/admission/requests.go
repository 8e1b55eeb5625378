// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package admission

import (
	"strings"
	"time"
)

// The controller is the one owner of request counts: the router admits and
// settles requests through it, the lifecycle reads it before it drains,
// parks, switches or idles an instance (lifecycle.Requests), and tells it
// when a launch ended. Instance IDs are "<deployment>/<index>".

// DeploymentOf is the deployment of an instance ID.
func DeploymentOf(instanceID string) string {
	if i := strings.LastIndexByte(instanceID, '/'); i > 0 {
		return instanceID[:i]
	}
	return instanceID
}

// instance returns an instance's counts; ok is false for an unknown one.
func (c *Controller) instance(instanceID string) (InstanceCounts, bool) {
	d := c.Lookup(DeploymentOf(instanceID))
	if d == nil {
		return InstanceCounts{}, false
	}
	return d.Instance(instanceID)
}

// Active is the number of requests admitted to an instance that its
// engine may still be working on: in flight, or cut and waiting for the
// engine's load reading or the end of an abort.
func (c *Controller) Active(instanceID string) int {
	ic, _ := c.instance(instanceID)
	return ic.Live + ic.SettleWhenIdle + ic.SettleOnAbort
}

// SettleAtStop is the number of an instance's cut requests that only its
// next stop settles.
func (c *Controller) SettleAtStop(instanceID string) int {
	ic, _ := c.instance(instanceID)
	return ic.SettleAtStop
}

// Waiting is the number of requests queued for a deployment.
func (c *Controller) Waiting(deployment string) int {
	d := c.Lookup(deployment)
	if d == nil {
		return 0
	}
	return d.Counts().Waiting
}

// Stopped settles what the launches of an instance up to generation held.
func (c *Controller) Stopped(instanceID string, generation uint64) {
	if d := c.Lookup(DeploymentOf(instanceID)); d != nil {
		d.Stopped(instanceID, generation)
	}
}

// OldestWaiting is when the longest-waiting request for a deployment
// arrived; ok is false when nobody waits.
func (c *Controller) OldestWaiting(deployment string) (time.Time, bool) {
	d := c.Lookup(deployment)
	if d == nil {
		return time.Time{}, false
	}
	return d.OldestWaiting()
}

// Contend asks a deployment to end its turn (Deployment.Contend).
func (c *Controller) Contend(deployment string, requests int, linger time.Duration) <-chan struct{} {
	return c.Deployment(deployment).Contend(requests, linger)
}

// CloseTurn ends a deployment's contended turn now (Deployment.CloseTurn).
func (c *Controller) CloseTurn(deployment string) {
	if d := c.Lookup(deployment); d != nil {
		d.CloseTurn()
	}
}

// Reopen opens a deployment's gate again (Deployment.Reopen).
func (c *Controller) Reopen(deployment string) {
	if d := c.Lookup(deployment); d != nil {
		d.Reopen()
	}
}

// ServiceTime is how long a request of a deployment holds a place, on
// average (0 when unknown).
func (c *Controller) ServiceTime(deployment string) time.Duration {
	if d := c.Lookup(deployment); d != nil {
		return d.ServiceTime()
	}
	return 0
}

// ArrivalRate is a deployment's recent arrivals per second (0 when
// unknown).
func (c *Controller) ArrivalRate(deployment string) float64 {
	if d := c.Lookup(deployment); d != nil {
		return d.ArrivalRate()
	}
	return 0
}

// Places is a deployment's running places per instance (DefaultPlaces
// when the router has not seen it).
func (c *Controller) Places(deployment string) int {
	if d := c.Lookup(deployment); d != nil {
		return d.Counts().Places
	}
	return DefaultPlaces
}

// TurnEnded says why a deployment's last contended turn ended and how many
// places it granted after it was contended.
func (c *Controller) TurnEnded(deployment string) (why string, served int) {
	if d := c.Lookup(deployment); d != nil {
		t := d.Turn()
		return t.Why, t.Served
	}
	return "", 0
}
