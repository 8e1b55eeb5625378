// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/engines"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/flags"
)

// engineView builds the wire form of a registration.
func engineView(rec *structs.EngineRecord) wire.Engine {
	return wire.Engine{
		Name: rec.Name, Family: rec.Family, Version: rec.Version, Verified: rec.Verified, Path: rec.Path,
		Program: rec.Program, Digest: rec.Digest, Details: rec.Details, Approvals: rec.Approvals, AddedAt: rec.AddedAt,
	}
}

// engineViews builds the engines list (sorted as the registry sorts it).
func engineViews(list []engines.Registration) []wire.Engine {
	out := make([]wire.Engine, 0, len(list))
	for i := range list {
		v := engineView(&list[i].EngineRecord)
		v.UsedBy = list[i].UsedBy
		out = append(out, v)
	}
	return out
}

// addRequest is the registry's form of an add request.
// EngineAddRequest is a registration request as the engine registry takes
// it (a host registers the engines of the cluster's desired state with
// it, as its management API does).
func EngineAddRequest(req wire.EngineAddRequest) engines.AddRequest { return addRequest(req) }

func addRequest(req wire.EngineAddRequest) engines.AddRequest {
	return engines.AddRequest{
		Name: req.Name, Family: req.Family, Path: req.Path, Manifest: req.Manifest, ManifestFile: req.ManifestFile,
		Approvals: req.Approvals, Env: req.Env, ExpectDigest: req.ExpectDigest, DryRun: req.DryRun,
	}
}

// engineDetected builds the answer of an add.
func engineDetected(a *engines.Added) *wire.EngineDetected {
	return &wire.EngineDetected{
		APIVersion: wire.APIVersion, Engine: engineView(a.Record), ToolchainMissing: a.ToolchainMissing, Notes: a.Notes,
		Details: a.Details, Registered: a.Registered,
	}
}

// flagTable builds a family's flag table from its driver's answer.
func flagTable(family string, resp *sdk.FlagsResponse) *wire.FlagTable {
	out := &wire.FlagTable{APIVersion: wire.APIVersion, Family: family}
	for _, rule := range resp.Rules {
		out.Rules = append(out.Rules, wire.FlagRule{
			Name: rule.Name, Kind: flags.KindName(rule.Kind), Class: flags.ClassName(rule.Class),
			Reason: rule.Reason, Approval: rule.Approval, Aliases: rule.Aliases,
		})
	}
	return out
}
