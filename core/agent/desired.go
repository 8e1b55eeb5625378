// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"encoding/json"

	"github.com/capyctl/capyctl/core/api"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/structs"
)

// metaClusterEngines lists, in the host's store, the engines it
// registered from the cluster's desired state: those it removes when the
// cluster no longer wants them (an engine the operator registered on the
// host itself is never removed).
const metaClusterEngines = "fleet_engines"

// Changed implements fleet.Local: the lifecycle publishes its route table
// after every instance transition.
func (a *Agent) Changed() <-chan struct{} { return a.Lifecycle.Board().Changed() }

// ApplyDesired implements fleet.Local: the host reconciles what it runs
// with its share of the cluster's desired state.
func (a *Agent) ApplyDesired(ctx context.Context, d *hostv1.Desired) []*hostv1.DesiredResult {
	return a.applyEngines(ctx, d.GetEngines())
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
	data, _ := json.Marshal(names)
	if err := a.Store.SetMeta(metaClusterEngines, string(data)); err != nil {
		a.logger.Warn("record the engines registered for the cluster", "error", err)
	}
}
