// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package jobspec

import (
	"strings"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// Defaults of a deployment's fields.
const (
	DefaultAPI                = structs.APIChat
	DefaultInstances          = 1
	DefaultActivation         = structs.ActivationOnDemand
	DefaultRequestDeadline    = structs.Duration(600 * time.Second)
	DefaultStreamIdle         = structs.Duration(120 * time.Second)
	DefaultClientReadIdle     = structs.Duration(10 * time.Second)
	DefaultMaxChunkBytes      = structs.ByteSize(64 * structs.KiB)
	DefaultMaxWaiting         = 64
	DefaultContentFingerprint = "measured"
	// DefaultLMCache runs LMCache where it is qualified (restart_only on
	// vLLM 0.32 and SGLang 0.5.22 with LMCache 0.5.6+).
	DefaultLMCache = structs.LMCacheAuto
	// DefaultLMCachePool is the LMCache pool in host RAM.
	DefaultLMCachePool = structs.ByteSize(4 * structs.GiB)
)

// Provenance values.
const (
	FromFile    = "file"
	FromDefault = "default"
)

// fieldPaths are the fixed fields of a deployment, as written in a job
// spec; Provenance names each of them (and each resources phase field and
// engine_config.<family> key the operator wrote).
var fieldPaths = []string{
	"name", "engine", "api", "routes", "residency", "lmcache", "lmcache_pool", "instances", "request_deadline",
	"model.path", "model.hf", "model.revision", "model.content_fingerprint",
	"resources",
	"lifecycle.warm", "lifecycle.activation", "lifecycle.ready_idle_timeout", "lifecycle.parked_idle_timeout",
	"timeouts.initialize", "timeouts.wake", "timeouts.stop",
	"limits.stream_idle", "limits.client_read_idle", "limits.max_chunk_bytes", "limits.max_waiting",
	"engine_config.max_concurrent_requests", "engine_config.context_length", "engine_config.dtype",
	"engine_config.quantization", "engine_config.kv_cache_dtype", "engine_config.cuda_graphs",
	"engine_config.trust_remote_code", "engine_config.memory.request", "engine_config.memory.kv_cache",
	"engine_config.memory.startup", "engine_config.accept_extra_args", "engine_config.extra_args",
	"engine_config.env",
}

// complete fills the fields the operator did not set (has reports those
// set) and records the provenance of every field. A field set to its zero
// value stays set, for validation to judge.
func complete(d *structs.Deployment, has func(path string) bool) {
	if !has("api") {
		d.API = DefaultAPI
	}
	if !has("routes") {
		d.Routes = []string{d.Name}
	}
	if !has("instances") {
		d.Instances = DefaultInstances
	}
	if !has("lmcache") {
		d.LMCache = DefaultLMCache
	}
	if d.Topology != nil {
		if !has("topology.tensor_parallel") {
			d.Topology.TensorParallel = 1
		}
		if !has("topology.pipeline_parallel") {
			d.Topology.PipelineParallel = 1
		}
	}
	if !has("lmcache_pool") {
		d.LMCachePool = DefaultLMCachePool
	}
	if !has("request_deadline") {
		d.RequestDeadline = DefaultRequestDeadline
	}
	if !has("lifecycle.activation") {
		d.Lifecycle.Activation = DefaultActivation
	}
	if !has("limits.stream_idle") {
		d.Limits.StreamIdle = DefaultStreamIdle
	}
	if !has("limits.client_read_idle") {
		d.Limits.ClientReadIdle = DefaultClientReadIdle
	}
	if !has("limits.max_chunk_bytes") {
		d.Limits.MaxChunkBytes = DefaultMaxChunkBytes
	}
	if !has("limits.max_waiting") {
		d.Limits.MaxWaiting = DefaultMaxWaiting
	}
	if !has("model.content_fingerprint") {
		d.Model.ContentFingerprint = DefaultContentFingerprint
	}
	// hf = "org/name@<commit>" is short for hf = "org/name" plus revision.
	if name, rev, ok := strings.Cut(d.Model.HF, "@"); ok && (d.Model.Revision == "" || d.Model.Revision == rev) {
		d.Model.HF, d.Model.Revision = name, rev
	}

	prov := map[string]string{}
	for _, p := range fieldPaths {
		prov[p] = FromDefault
		if has(p) {
			prov[p] = FromFile
		}
	}
	if d.Resources != nil {
		delete(prov, "resources")
		if len(d.Resources.Phases) == 0 {
			for _, f := range []string{"gpu", "ram"} {
				prov["resources."+f] = FromDefault
				if has("resources." + f) {
					prov["resources."+f] = FromFile
				}
			}
		}
		for phase := range d.Resources.Phases {
			for _, f := range []string{"gpu", "ram"} {
				p := "resources." + phase + "." + f
				prov[p] = FromDefault
				if has(p) {
					prov[p] = FromFile
				}
			}
		}
	}
	for family, raw := range d.EngineConfig.Family {
		for _, key := range objectKeys(raw) {
			prov["engine_config."+family+"."+key] = FromFile
		}
	}
	d.Provenance = prov
}
