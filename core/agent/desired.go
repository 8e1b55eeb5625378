// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"maps"
	"sort"
	"time"

	"github.com/capyctl/capyctl/core/api"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/lifecycle"
	"github.com/capyctl/capyctl/core/structs"
)

// metaClusterEngines lists, in the host's store, the engines it
// registered from the cluster's desired state: those it removes when the
// cluster no longer wants them (an engine the operator registered on the
// host itself is never removed).
const metaClusterEngines = "fleet_engines"

// Changed implements hostagent.Local: the lifecycle publishes every write of
// an instance's record (a transition, a last error, a charge).
func (a *Agent) Changed() <-chan struct{} { return a.Lifecycle.Changed() }

// ApplyDesired implements hostagent.Local: the host reconciles what it runs
// with its share of the cluster's desired state.
func (a *Agent) ApplyDesired(ctx context.Context, d *hostv1.Desired) []*hostv1.DesiredResult {
	out := a.applyEngines(ctx, d.GetEngines())
	return append(out, a.applyDeployments(ctx, d.GetDeployments())...)
}

// applyEngines registers the desired engines the host lacks and removes
// those it registered for the cluster that are no longer desired.
func (a *Agent) applyEngines(ctx context.Context, desired []*hostv1.DesiredEngine) []*hostv1.DesiredResult {
	var out []*hostv1.DesiredResult
	have := map[string]bool{}
	if list, err := a.Engines.List(); err == nil {
		for _, e := range list {
			have[e.Name] = true
		}
	}
	owned := a.clusterEngines()
	want := map[string]bool{}
	for _, e := range desired {
		want[e.GetName()] = true
		if have[e.GetName()] {
			continue
		}
		var req wire.EngineAddRequest
		err := json.Unmarshal(e.GetRequestJson(), &req)
		if err == nil {
			req.Name, req.DryRun = e.GetName(), false
			_, err = a.Engines.Add(ctx, api.EngineAddRequest(req))
		}
		if err != nil {
			out = append(out, engineResult(e.GetName(), err))
			a.logger.Warn("an engine of the cluster's desired state could not be registered here", "engine", e.GetName(), "error", err)
			continue
		}
		owned[e.GetName()] = true
		a.Lifecycle.Journal("engine_added", "", map[string]any{"engine": e.GetName(), "by": "cluster"})
	}
	for name := range owned {
		if want[name] {
			continue
		}
		if err := a.Engines.Remove(name); err != nil && !structs.HasCode(err, structs.CodeEngineNotFound) {
			out = append(out, engineResult(name, err))
			continue
		}
		delete(owned, name)
		a.Lifecycle.Journal("engine_removed", "", map[string]any{"engine": name, "by": "cluster"})
	}
	a.saveClusterEngines(owned)
	return out
}

func engineResult(name string, err error) *hostv1.DesiredResult {
	e := structs.AsError(err)
	return &hostv1.DesiredResult{Kind: "engine", Name: name, Code: string(e.Code), Message: e.Message}
}

func (a *Agent) clusterEngines() map[string]bool {
	out := map[string]bool{}
	if v, err := a.Store.Meta(metaClusterEngines); err == nil && v != "" {
		var names []string
		if json.Unmarshal([]byte(v), &names) == nil {
			for _, n := range names {
				out[n] = true
			}
		}
	}
	return out
}

func (a *Agent) saveClusterEngines(owned map[string]bool) {
	names := make([]string, 0, len(owned))
	for n := range owned {
		names = append(names, n)
	}
	sort.Strings(names)
	if err := a.setMetaChanged(metaClusterEngines, names); err != nil {
		a.logger.Warn("record the engines registered for the cluster", "error", err)
	}
}

// setMetaChanged writes v (its JSON form) under key in the store's meta
// unless that is what the store holds already: every share the host
// applies passes here, and a synced write each time (1 to 3 ms on a disk)
// delayed the host's answer, and the start it carries, for nothing.
func (a *Agent) setMetaChanged(key string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if had, err := a.Store.Meta(key); err == nil && had == string(data) {
		return nil
	}
	return a.Store.SetMeta(key, string(data))
}

// metaClusterDeployments maps, in the host's store, each deployment the
// host runs from the cluster's desired state to what it applied of it:
// the host deletes those the cluster no longer places on it, and never
// touches a deployment of its own.
const metaClusterDeployments = "fleet_deployments"

// placedRecord is what a host applied of one deployment of its share: the
// cluster's revision and its count of starts.
type placedRecord struct {
	Revision uint64 `json:"revision"`
	Starts   uint64 `json:"starts,omitempty"`
	// ActedUnixMs is when the host last made, updated or started it.
	ActedUnixMs int64 `json:"acted_unix_ms,omitempty"`
	// Digest is the share's spec as the host applied it: a share that
	// changes without a new revision (instances moved to or off this
	// host) is applied again.
	Digest string `json:"digest,omitempty"`
}

// specDigest names a share's spec (the deployment's, with the instances
// this host runs).
func specDigest(spec []byte) string {
	sum := sha256.Sum256(spec)
	return hex.EncodeToString(sum[:8])
}

// applyDeployments makes what the host runs match its share: each
// deployment placed on it made or updated (its lifecycle plans, admits
// and starts it as for a deploy on the host), its desired state followed,
// and each deployment the cluster no longer places here deleted.
func (a *Agent) applyDeployments(ctx context.Context, desired []*hostv1.DesiredDeployment) []*hostv1.DesiredResult {
	var out []*hostv1.DesiredResult
	owned := a.clusterDeployments()
	want := map[string]bool{}
	for _, d := range desired {
		want[d.GetName()] = true
		err := a.applyDeployment(ctx, d, owned)
		// Every deployment of the share answers when the host last acted
		// on it: a server waiting for its ledger's verdict reads what the
		// instances recorded since.
		r := &hostv1.DesiredResult{Kind: "deployment", Name: d.GetName(), ActedUnixMs: owned[d.GetName()].ActedUnixMs}
		a.headAddress(d.GetName(), r)
		if err != nil {
			e := structs.AsError(err)
			r.Code, r.Message = string(e.Code), e.Message
			a.logger.Warn("a deployment of the cluster's desired state could not be applied here", "deployment", d.GetName(), "error", err)
		}
		out = append(out, r)
	}
	for name := range owned {
		if want[name] {
			continue
		}
		if err := a.Lifecycle.DeleteDeployment(ctx, name); err != nil && !structs.HasCode(err, structs.CodeNotFound) {
			e := structs.AsError(err)
			out = append(out, &hostv1.DesiredResult{Kind: "deployment", Name: name, Code: string(e.Code), Message: e.Message})
			continue
		}
		delete(owned, name)
		a.Lifecycle.Journal("deployment_deleted", name, map[string]any{"by": "cluster"})
	}
	a.saveClusterDeployments(owned)
	return out
}

// headAddress completes a group head's result with the rendezvous
// address its host picked (its peer address and a port of its
// rendezvous_ports): the server writes it into the workers' shares.
func (a *Agent) headAddress(name string, r *hostv1.DesiredResult) {
	view, err := a.Lifecycle.Deployment(name)
	if err != nil {
		return
	}
	if g := view.Record.Spec.Group; g.IsHead() && g.RendezvousPort != 0 {
		r.HeadAddress, r.RendezvousPort = g.HeadAddress, int32(g.RendezvousPort)
	}
}

// applyDeployment makes one deployment of the share, updates it to the
// cluster's revision, and follows its desired state.
func (a *Agent) applyDeployment(ctx context.Context, d *hostv1.DesiredDeployment, owned map[string]placedRecord) error {
	name := d.GetName()
	view, err := a.Lifecycle.Deployment(name)
	exists := err == nil
	done, mine := owned[name]
	if exists && !mine {
		return structs.Errf(structs.CodeConflict, "host %s runs a deployment of its own named %s: delete it on the host (capyctl --address HOST delete deployment %s) or give the cluster's another name",
			a.s.Hostname, name, name)
	}
	digest := specDigest(d.GetSpecJson())
	if exists && done.Revision == d.GetRevision() && done.Digest == "" {
		// Recorded before shares had digests: this revision is applied.
		done.Digest = digest
		owned[name] = done
		a.saveClusterDeployments(owned)
	}
	if !exists || done.Revision != d.GetRevision() || done.Digest != digest {
		spec, err := api.SpecFromJSON(d.GetSpecJson())
		if err != nil {
			return err
		}
		// The cluster's from its first instance on: its journals say so
		// (a server adopts only a host's own), and a failed deploy is
		// cleaned up by the share that no longer names it.
		done.ActedUnixMs = time.Now().UnixMilli()
		owned[name] = done
		a.saveClusterDeployments(owned)
		opts := lifecycle.DeployOptions{Activate: d.GetDesired() == structs.DesiredRunning, Validate: a.Lifecycle.ValidateDeployment}
		if exists {
			opts.ExpectedRevision = view.Record.Revision
		}
		if _, _, err := a.Lifecycle.Deploy(ctx, spec, opts); err != nil {
			return err
		}
		done = placedRecord{Revision: d.GetRevision(), Starts: done.Starts, ActedUnixMs: done.ActedUnixMs, Digest: digest}
		owned[name] = done
		a.saveClusterDeployments(owned)
		if view, err = a.Lifecycle.Deployment(name); err != nil {
			return err
		}
	}
	switch want := d.GetDesired(); {
	case want == structs.DesiredRunning && (view.Record.Desired != structs.DesiredRunning || d.GetStarts() > done.Starts):
		// A start (a new one counts even when it was running): the
		// stopped or failed instances start again.
		owned[name] = placedRecord{Revision: done.Revision, Starts: d.GetStarts(), ActedUnixMs: time.Now().UnixMilli(), Digest: done.Digest}
		a.saveClusterDeployments(owned)
		return a.Lifecycle.StartDeployment(ctx, name, lifecycle.StartOptions{Evict: d.GetEvict()})
	case want == structs.DesiredStopped && view.Record.Desired != structs.DesiredStopped:
		return a.Lifecycle.StopDeployment(ctx, name, false)
	}
	return nil
}

func (a *Agent) clusterDeployments() map[string]placedRecord {
	out := map[string]placedRecord{}
	if v, err := a.Store.Meta(metaClusterDeployments); err == nil && v != "" {
		_ = json.Unmarshal([]byte(v), &out)
	}
	return out
}

func (a *Agent) saveClusterDeployments(owned map[string]placedRecord) {
	if err := a.setMetaChanged(metaClusterDeployments, owned); err != nil {
		a.logger.Warn("record the deployments placed by the cluster", "error", err)
	}
	a.placedMu.Lock()
	a.placed = maps.Clone(owned)
	a.placedMu.Unlock()
}

// isPlaced reports whether the cluster placed a deployment on this host.
func (a *Agent) isPlaced(dep string) bool {
	a.placedMu.Lock()
	defer a.placedMu.Unlock()
	if a.placed == nil {
		a.placed = a.clusterDeployments()
	}
	_, ok := a.placed[dep]
	return ok
}
