// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"net/http"
	"regexp"
	"strings"

	"github.com/gorilla/mux"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
)

// secretName matches the names of settings, variables and options whose
// values are secrets.
// Words count whole: "hf_token" and "FAKE_ENGINE_API_KEY" are secrets,
// "max_tokens" and "TOKENIZERS_PARALLELISM" are not.
var secretName = regexp.MustCompile(`(?i)(^|[_.-])(api[_-]?key|key|token|secret|password|passwd|credentials?|auth|cookie)($|[_.-])`)

// secretValue matches values that look like credentials wherever they are
// (Hugging Face tokens, bearer values, URL user info).
var secretValue = regexp.MustCompile(`(?i)(hf_[A-Za-z0-9]{8,}|bearer\s+\S+|://[^/@\s]+:[^/@\s]+@)`)

// IsSecretName reports whether a setting, variable or option name holds a
// secret, so the API shows it as wire.Redacted.
func IsSecretName(name string) bool { return secretName.MatchString(name) }

// RedactValue returns v, or wire.Redacted when the name says it is a
// secret or the value looks like a credential.
func RedactValue(name, v string) string {
	if v == "" {
		return v
	}
	if IsSecretName(name) || secretValue.MatchString(v) {
		return wire.Redacted
	}
	return v
}

// RedactEnv returns a copy of env with secret values redacted.
func RedactEnv(env map[string]string) map[string]string {
	if env == nil {
		return nil
	}
	out := make(map[string]string, len(env))
	for k, v := range env {
		out[k] = RedactValue(k, v)
	}
	return out
}

// RedactArgv returns a copy of argv where the value of a secret-named
// option (--api-key X, --hf-token=X) and credential-looking words are
// redacted.
func RedactArgv(argv []string) []string {
	out := make([]string, len(argv))
	for i := 0; i < len(argv); i++ {
		a := argv[i]
		if strings.HasPrefix(a, "-") {
			name, _, hasVal := strings.Cut(a, "=")
			if IsSecretName(strings.TrimLeft(name, "-")) {
				if hasVal {
					out[i] = name + "=" + wire.Redacted
					continue
				}
				out[i] = a
				if i+1 < len(argv) && !strings.HasPrefix(argv[i+1], "-") {
					i++
					out[i] = wire.Redacted
				}
				continue
			}
		}
		if secretValue.MatchString(a) {
			out[i] = wire.Redacted
			continue
		}
		out[i] = a
	}
	return out
}

func (b *Backend) effectiveConfig(w http.ResponseWriter, r *http.Request) {
	v, err := b.Lifecycle.Deployment(mux.Vars(r)["name"])
	if err != nil {
		writeMgmtError(w, err)
		return
	}
	spec := v.Record.Spec
	spec.EngineConfig.Env = RedactEnv(spec.EngineConfig.Env)
	spec.EngineConfig.ExtraArgs = RedactArgv(spec.EngineConfig.ExtraArgs)
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
			el.Argv = RedactArgv(in.Launch.Argv)
			el.Env = RedactEnv(in.Launch.Env)
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
		s.Value = RedactValue(s.Path, s.Value)
		out.Settings = append(out.Settings, s)
	}
	writeJSON(w, http.StatusOK, out)
}
