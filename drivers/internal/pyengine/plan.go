// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pyengine

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/enginekit"
	"github.com/capyctl/capyctl/sdk/flags"
)

// DefaultMaxConcurrent is the running requests of an instance when the
// deployment leaves max_concurrent_requests unset.
const DefaultMaxConcurrent = 32

// Common checks what every Python engine checks alike: extra_args need
// accept_extra_args and pass the flag table; engine_config.env passes it;
// trust_remote_code needs the host's permission; the residency is known and
// host_backed needs a discrete card; the model directory, when resolved,
// is a directory. typed maps each job-spec field the deployment sets to
// true (Rule.Field). It returns extra_args parsed.
func Common(t *flags.Table, dep *sdk.Deployment, host *sdk.HostPolicy, typed map[string]bool, r *enginekit.Refusals) []flags.Arg {
	args := enginekit.CheckOptions(t, dep, host, typed, r)
	if dep.TrustRemoteCode && !flags.HostApprovals(host).RemoteCode {
		r.Add(flags.CodeRemoteCode, "engine_config.trust_remote_code",
			"trust_remote_code runs code the checkpoint ships; the host must allow it: capyctl engine add ... --allow-remote-code")
	}
	switch dep.Residency {
	case "", enginekit.ResidencyDeep, enginekit.ResidencyRestartOnly:
	case enginekit.ResidencyHostBacked:
		if host.Unified {
			r.Add(enginekit.CodeHostBackedUnavailable, "residency", "host_backed keeps weights in host RAM beside a discrete card; this host has unified memory: use deep or restart_only")
		}
	default:
		r.Add(flags.CodeInvalidConfig, "residency", "unknown residency %q (deep, host_backed or restart_only)", dep.Residency)
	}
	if d := dep.ModelDir; d != "" {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			r.Add(enginekit.CodeCheckpointUnusable, "model", "the model directory %s cannot be read", d)
		}
	}
	if dep.MaxConcurrentRequests < 0 {
		r.Add(flags.CodeInvalidConfig, "engine_config.max_concurrent_requests", "max_concurrent_requests must be positive")
	}
	return args
}

// TypedFields returns the typed job-spec fields a deployment sets, for
// duplicate detection against extra_args.
func TypedFields(dep *sdk.Deployment, family map[string]bool) map[string]bool {
	out := map[string]bool{}
	set := func(field string, ok bool) {
		if ok {
			out[field] = true
		}
	}
	set("engine_config.dtype", dep.Dtype != "")
	set("engine_config.quantization", dep.Quantization != "")
	set("engine_config.kv_cache_dtype", dep.KVCacheDtype != "")
	set("engine_config.context_length", dep.ContextLength > 0)
	set("engine_config.cuda_graphs", dep.CUDAGraphs != "")
	set("engine_config.trust_remote_code", dep.TrustRemoteCode)
	for k, v := range family {
		set(k, v)
	}
	return out
}

// EnvOptions is what BaseEnv renders from.
type EnvOptions struct {
	// Venv is the environment's root (its bin leads PATH).
	Venv string
	// Host is the host's policy.
	Host *sdk.HostPolicy
	// Launch is the launch context (launch directory, devices).
	Launch *sdk.LaunchContext
}

// BaseEnv is the environment every Python engine starts from: a closed
// PATH (the venv's bin, the CUDA toolkit's, the system's), HOME in the
// launch directory, unbuffered output, offline Hugging Face, the card
// pinned, the host's own variables, and DO_NOT_TRACK=1 unless the host
// allows engine telemetry.
func BaseEnv(o EnvOptions) enginekit.Env {
	path := filepath.Join(o.Venv, "bin")
	if ch := o.Host.CUDAHome; ch != "" {
		path += ":" + filepath.Join(ch, "bin")
	}
	env := enginekit.NewEnv(path + ":" + enginekit.SystemPath)
	env["PYTHONUNBUFFERED"] = "1"
	env["HF_HUB_OFFLINE"] = "1"
	if d := o.Launch.LaunchDir; d != "" {
		env["HOME"] = d
	}
	if ch := o.Host.CUDAHome; ch != "" {
		env["CUDA_HOME"] = ch
	}
	env.PinDevices(o.Launch)
	env.Merge(o.Host.HostEnv)
	env.NoTelemetry(o.Host)
	return env
}

// Key describes one key of engine_config.<family>.
type Key struct {
	// Name is the key.
	Name string
	// Type is "int", "string" or "bool".
	Type string
	// Values, for a string, are the values allowed; any value when empty.
	Values []string
	// Min bounds an int from below.
	Min int64
	// Doc is shown in the config schema.
	Doc string
}

// FamilyConfig is a decoded engine_config.<family> block.
type FamilyConfig map[string]json.RawMessage

// Int returns an int key.
func (c FamilyConfig) Int(name string) (int64, bool) {
	raw, ok := c[name]
	if !ok {
		return 0, false
	}
	var f float64
	if json.Unmarshal(raw, &f) != nil {
		return 0, false
	}
	return int64(f), true
}

// String returns a string key.
func (c FamilyConfig) String(name string) string {
	var s string
	_ = json.Unmarshal(c[name], &s)
	return s
}

// Has reports whether a key is set.
func (c FamilyConfig) Has(name string) bool { _, ok := c[name]; return ok }

// Declared reports whether a string key makes a choice: it is set, and not
// to "auto".
func (c FamilyConfig) Declared(name string) bool {
	s := c.String(name)
	return s != "" && s != "auto"
}

// DecodeFamily checks engine_config.<family>: every key known and of its
// type. Unknown keys are unknown_config_key:engine_config.<family>.<key>.
func DecodeFamily(raw []byte, family string, keys []Key, r *enginekit.Refusals) FamilyConfig {
	cfg := FamilyConfig{}
	if len(raw) == 0 {
		return cfg
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		r.Add(flags.CodeInvalidConfig, "engine_config."+family, "engine_config.%s is not an object: %v", family, err)
		return FamilyConfig{}
	}
	byName := map[string]Key{}
	var known []string
	for _, k := range keys {
		byName[k.Name] = k
		known = append(known, k.Name)
	}
	names := make([]string, 0, len(cfg))
	for n := range cfg {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		field := "engine_config." + family + "." + n
		k, ok := byName[n]
		if !ok {
			r.Add(enginekit.CodeUnknownConfigKey+":"+field, field, "engine_config.%s has no key %q (known: %s)", family, n, strings.Join(known, ", "))
			delete(cfg, n)
			continue
		}
		raw := cfg[n]
		switch k.Type {
		case "int":
			var f float64
			if json.Unmarshal(raw, &f) != nil || f != float64(int64(f)) {
				r.Add(flags.CodeInvalidConfig, field, "%s must be a whole number", field)
				delete(cfg, n)
			} else if int64(f) < k.Min {
				r.Add(flags.CodeInvalidConfig, field, "%s must be at least %d", field, k.Min)
				delete(cfg, n)
			}
		case "bool":
			var b bool
			if json.Unmarshal(raw, &b) != nil {
				r.Add(flags.CodeInvalidConfig, field, "%s must be true or false", field)
				delete(cfg, n)
			}
		default:
			var s string
			if json.Unmarshal(raw, &s) != nil {
				r.Add(flags.CodeInvalidConfig, field, "%s must be a string", field)
				delete(cfg, n)
			} else if len(k.Values) > 0 && !slices.Contains(k.Values, s) {
				r.Add(flags.CodeInvalidConfig, field, "%s must be one of %s", field, strings.Join(k.Values, ", "))
				delete(cfg, n)
			}
		}
	}
	return cfg
}

// ConfigSchema renders Describe's config_schema for a family's keys.
func ConfigSchema(family string, keys []Key) string {
	props := map[string]any{}
	for _, k := range keys {
		p := map[string]any{"type": k.Type}
		if len(k.Values) > 0 {
			p["values"] = k.Values
		}
		if k.Doc != "" {
			p["doc"] = k.Doc
		}
		props[k.Name] = p
	}
	b, _ := json.Marshal(map[string]any{family: props})
	return string(b)
}

// WeightsBytes is the size of a checkpoint's weight files: the
// *.safetensors files, or the *.bin and *.pt files when there are none.
// Links are followed (Hugging Face cache snapshots are links).
func WeightsBytes(dir string) int64 {
	if dir == "" {
		return 0
	}
	sum := func(pattern string) int64 {
		matches, _ := filepath.Glob(filepath.Join(dir, pattern))
		var n int64
		for _, m := range matches {
			if fi, err := os.Stat(m); err == nil && fi.Mode().IsRegular() {
				n += fi.Size()
			}
		}
		return n
	}
	if n := sum("*.safetensors"); n > 0 {
		return n
	}
	return sum("*.bin") + sum("*.pt")
}

// StartupTimeout is the readiness deadline derived from the weights: five
// minutes, plus a minute per 4 GiB, at most an hour.
func StartupTimeout(weights int64) time.Duration {
	d := 5*time.Minute + time.Duration(weights/(4<<30))*time.Minute
	return min(d, time.Hour)
}

// WakeTimeout bounds a wake: a minute, plus a minute per 8 GiB of weights
// reloaded from disk (deep), at most half an hour.
func WakeTimeout(weights int64, residency string) time.Duration {
	d := time.Minute
	if residency == enginekit.ResidencyDeep {
		d += time.Duration(weights/(8<<30)) * time.Minute
	}
	return min(d, 30*time.Minute)
}

// Fraction renders part/total as the fraction engines take
// (--gpu-memory-utilization, --mem-fraction-static), four decimals at most,
// rounded down, within (0, 0.98]; "" when either is unknown.
//
// IMPORTANT: rounded down, never to the nearest. vLLM asks the card for
// ceil(total × gpu_memory_utilization) and refuses to start when less is
// free (request_memory in vllm/v1/worker/utils.py); a fraction rounded up
// asks for up to 0.00005 × total more than the ledger granted, which a card
// packed to its grants does not have.
func Fraction(part, total int64) string {
	if part <= 0 || total <= 0 {
		return ""
	}
	f := math.Floor(float64(part)*10000/float64(total)) / 10000
	f = min(f, 0.98)
	f = max(f, 0.0001)
	s := strconv.FormatFloat(f, 'f', 4, 64)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s
}

// MaxConcurrent is the deployment's max_concurrent_requests or def.
func MaxConcurrent(dep *sdk.Deployment, def int) int {
	if n := int(dep.MaxConcurrentRequests); n > 0 {
		return n
	}
	return def
}
