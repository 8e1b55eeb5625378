// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package structs

import (
	"encoding/json"
	"regexp"
	"strings"
)

// Redacted replaces a secret's value wherever CapyCTL shows configuration:
// the management API, the CLI, events and logs.
const Redacted = "<redacted>"

// secretName matches the names of settings, variables and options whose
// values are secrets.
// Words count whole: "hf_token" and "FAKE_ENGINE_API_KEY" are secrets,
// "max_tokens" and "TOKENIZERS_PARALLELISM" are not.
var secretName = regexp.MustCompile(`(?i)(^|[_.-])(api[_-]?key|key|token|secret|password|passwd|credentials?|auth|cookie)($|[_.-])`)

// secretValue matches values that look like credentials wherever they are
// (Hugging Face tokens, bearer values, URL user info).
var secretValue = regexp.MustCompile(`(?i)(hf_[A-Za-z0-9]{8,}|capyk_[0-9a-f]{12}_\S+|bearer\s+\S+|://[^/@\s]+:[^/@\s]+@)`)

// IsSecretName reports whether a setting, variable or option name holds a
// secret.
func IsSecretName(name string) bool { return secretName.MatchString(name) }

// RedactValue returns v, or Redacted when the name says it is a secret or
// the value looks like a credential.
func RedactValue(name, v string) string {
	if v == "" {
		return v
	}
	if IsSecretName(name) || secretValue.MatchString(v) {
		return Redacted
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
	if argv == nil {
		return nil
	}
	out := make([]string, len(argv))
	for i := 0; i < len(argv); i++ {
		a := argv[i]
		if strings.HasPrefix(a, "-") {
			name, _, hasVal := strings.Cut(a, "=")
			if IsSecretName(strings.TrimLeft(name, "-")) {
				if hasVal {
					out[i] = name + "=" + Redacted
					continue
				}
				out[i] = a
				if i+1 < len(argv) && !strings.HasPrefix(argv[i+1], "-") {
					i++
					out[i] = Redacted
				}
				continue
			}
		}
		if secretValue.MatchString(a) {
			out[i] = Redacted
			continue
		}
		out[i] = a
	}
	return out
}

// Redacted returns a copy of the deployment fit to show: the values of
// engine_config.env, engine_config.extra_args and the family blocks that
// are secrets (by name or by look) are Redacted. IMPORTANT: every output
// of a deployment spec (the management API, the CLI, events, logs) goes
// through it; the stored spec keeps the values, which the launch needs.
func (d Deployment) Redacted() Deployment {
	d.EngineConfig.Env = RedactEnv(d.EngineConfig.Env)
	d.EngineConfig.ExtraArgs = RedactArgv(d.EngineConfig.ExtraArgs)
	if d.EngineConfig.Family != nil {
		fam := make(map[string]json.RawMessage, len(d.EngineConfig.Family))
		for name, raw := range d.EngineConfig.Family {
			fam[name] = redactObject(raw)
		}
		d.EngineConfig.Family = fam
	}
	return d
}

// redactObject redacts a family block, a JSON object: a value under a
// secret name whatever its type, a credential-looking string anywhere, the
// value after a secret-named option in a list. What does not parse is kept
// out altogether.
func redactObject(raw json.RawMessage) json.RawMessage {
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err != nil {
		out, _ := json.Marshal(Redacted)
		return out
	}
	redactMap(obj)
	out, err := json.Marshal(obj)
	if err != nil {
		out, _ = json.Marshal(Redacted)
	}
	return out
}

func redactMap(obj map[string]any) {
	for k, v := range obj {
		if IsSecretName(k) && v != nil {
			obj[k] = Redacted
			continue
		}
		obj[k] = redactAny(v)
	}
}

func redactAny(v any) any {
	switch x := v.(type) {
	case string:
		return RedactValue("", x)
	case map[string]any:
		redactMap(x)
	case []any:
		words := make([]string, len(x))
		for i, e := range x {
			words[i], _ = e.(string)
		}
		red := RedactArgv(words)
		for i, e := range x {
			if _, ok := e.(string); ok {
				x[i] = red[i]
			} else {
				x[i] = redactAny(e)
			}
		}
	}
	return v
}
