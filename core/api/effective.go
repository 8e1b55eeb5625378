// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"net/http"

	"github.com/gorilla/mux"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
)

func (b *Backend) effectiveConfig(w http.ResponseWriter, r *http.Request) {
	v, err := b.Lifecycle.Deployment(mux.Vars(r)["name"])
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	spec := v.Record.Spec.Redacted()
	prov := spec.Provenance
	if prov == nil {
		prov = map[string]string{}
	}
	spec.Provenance = nil
	out := wire.EffectiveConfig{APIVersion: wire.APIVersion, Deployment: v.Record.Name, Revision: v.Record.Revision,
		Spec: spec, Provenance: prov, Instances: []wire.EffectiveLaunch{}}
	for _, in := range v.Instances {
		el := wire.EffectiveLaunch{ID: in.ID(), Index: in.Index, Engine: in.Engine, Driver: in.Driver}
		if in.Launch != nil {
			el.LaunchID = in.Launch.LaunchID
			el.Argv = structs.RedactArgv(in.Launch.Argv)
			el.Env = structs.RedactEnv(in.Launch.Env)
		}
		out.Instances = append(out.Instances, el)
	}
	writeJSON(w, http.StatusOK, out)
}

func (b *Backend) roleConfig(w http.ResponseWriter, r *http.Request) {
	if b.Config == nil {
		writeMgmtError(w, structs.Errf(structs.CodeUnsupported, "this role does not publish its configuration; run capyctl config show with its flags"))
		return
	}
	rc := b.Config()
	out := wire.RoleConfig{APIVersion: wire.APIVersion, Role: rc.Role, File: rc.File, Settings: make([]wire.ConfigSetting, 0, len(rc.Settings))}
	for _, s := range rc.Settings {
		s.Value = structs.RedactValue(s.Path, s.Value)
		out.Settings = append(out.Settings, s)
	}
	writeJSON(w, http.StatusOK, out)
}
