// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pyengine

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"strconv"

	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/enginekit"
)

// What follows decides whether an instance gets a private LMCache server
// and renders it (SPEC E8, release notes 0.1.7). The server is LMCache's
// own standalone store, started from the engine's environment as
//
//	<venv>/bin/python -m lmcache.v1.server 127.0.0.1 <leased port> cpu
//
// (lmcache/v1/server/__main__.py: positional host, port and storage,
// "cpu" by default; console script lmcache_server). The engine reaches it
// through LMCache's connector configured by LMCACHE_* variables (no
// config file: a file makes LMCache ignore the variables), with
// LMCACHE_REMOTE_URL = "lm://127.0.0.1:<port>". Sources are in
// website/content/engines/lmcache.md.

// LMCache modes of a deployment (lmcache = ...).
const (
	LMCacheAuto     = "auto"
	LMCacheOff      = "off"
	LMCacheRequired = "required"
)

// LMCacheDist is LMCache's distribution name in an engine's environment.
const LMCacheDist = "lmcache"

// LMCacheSeries and LMCacheMin bound the LMCache releases CapyCTL runs:
// 0.5.6 or a later 0.5.x.
var (
	LMCacheSeries = []string{"0.5"}
	LMCacheMin    = "0.5.6"
)

// LMCacheModule is the module of LMCache's standalone server.
const LMCacheModule = "lmcache.v1.server"

// DefaultLMCachePool is the pool when a deployment sets no lmcache_pool.
const DefaultLMCachePool int64 = 4 << 30

// LMCacheServerBytes is what the LMCache server itself holds besides the
// pool: a Python process that imports torch. IMPORTANT: an estimate, never
// measured: the server is a launch of its own, outside the engine's
// process group the ledger measures, and its store grows without a bound
// of its own (only the engine side's pool is bounded).
const LMCacheServerBytes int64 = 1 << 30

// LMCacheChunkTokens is the chunk LMCache stores and looks up KV by
// (LMCACHE_CHUNK_SIZE; 256 is LMCache's default).
const LMCacheChunkTokens = 256

// LMCacheFamily is what an engine family brings to the decision.
type LMCacheFamily struct {
	// Name is the engine's name in messages ("vLLM").
	Name string
	// Since is the first engine release that runs LMCache with CapyCTL.
	Since string
	// NoDecisions: the family runs decision deployments without LMCache
	// (SGLang fails with it while its radix cache is disabled,
	// sgl-project/sglang#45929).
	NoDecisions bool
}

// LMCacheInput is what PlanLMCache decides from.
type LMCacheInput struct {
	Family    LMCacheFamily
	Inst      *sdk.Installation
	Dep       *sdk.Deployment
	Host      *sdk.HostPolicy
	Launch    *sdk.LaunchContext
	Venv      *Venv
	Residency string
	// OwnConnector: the deployment renders its own KV connector
	// (an approved --kv-transfer-config), which LMCache's would replace.
	OwnConnector bool
	// Isolated: the driver runs the server where no other local user
	// reaches it (a network namespace of its own, which the engine joins:
	// the driver runs as root, and the instance is no group member, whose
	// ranks need the host's network). Without it LMCache does not run.
	Isolated bool
}

// LMCacheIsolationNeeded says why an instance runs no LMCache where it
// cannot be isolated. LMCache's server (lmcache.v1.server) and its
// connector (lm:// URLs, lmcache/v1/storage_backend/connector/
// lm_connector.py) speak TCP only (socket.AF_INET), with no
// authentication: on the host's loopback, any local user could read
// another user's prompts back out of the cache, or poison it.
const LMCacheIsolationNeeded = "LMCache's server and connector speak unauthenticated TCP only (lmcache.v1.server, lm_connector.py): on the host's loopback every local user could read or poison the cache, so CapyCTL runs it only in a network namespace of its own, which needs the driver to run as root and no group"

// LMCacheDecision is a plan's LMCache: the server and what the engine
// needs to reach it.
type LMCacheDecision struct {
	Plan *sdk.LMCachePlan
	// Env are the engine's LMCACHE_* variables (empty when it does not
	// run, or before the port is leased).
	Env map[string]string
}

// Runs reports whether the instance gets its LMCache.
func (d LMCacheDecision) Runs() bool { return d.Plan.Runs }

// LMCacheMode is a deployment's mode, auto when unset.
func LMCacheMode(dep *sdk.Deployment) string {
	if m := dep.LMCache; m != "" {
		return m
	}
	return LMCacheAuto
}

// PlanLMCache decides whether the instance gets a private LMCache server
// and renders it; lmcache = "required" where it cannot run adds a refusal
// lmcache_unavailable:<why>.
func PlanLMCache(in LMCacheInput, r *enginekit.Refusals) LMCacheDecision {
	mode := LMCacheMode(in.Dep)
	if mode != LMCacheAuto && mode != LMCacheOff && mode != LMCacheRequired {
		r.Add(enginekit.CodeLMCacheUnavailable+":mode", "lmcache", "lmcache is %q: want auto, off or required", mode)
		return LMCacheDecision{Plan: &sdk.LMCachePlan{Reason: "invalid mode"}}
	}
	off := func(key, why string) LMCacheDecision {
		if mode == LMCacheRequired {
			r.Add(enginekit.CodeLMCacheUnavailable+":"+key, "lmcache", "lmcache = \"required\", but %s", why)
		}
		return LMCacheDecision{Plan: &sdk.LMCachePlan{Reason: why}}
	}
	if mode == LMCacheOff {
		return LMCacheDecision{Plan: &sdk.LMCachePlan{Reason: "the deployment sets lmcache = \"off\""}}
	}
	if in.Host.LMCache == LMCacheOff {
		return off("host_off", "the host sets lmcache = \"off\"")
	}
	if in.Host.Retention == "zero" {
		// IMPORTANT: its cache would hold request content in host RAM.
		return off("retention_zero", "the host keeps no request data (retention = \"zero\"), and LMCache holds prompts' KV in host RAM")
	}
	if v := in.Inst.Version; v != "" && !VersionAtLeast(v, in.Family.Since) {
		return off("engine_version", fmt.Sprintf("%s %s predates %s, the first release CapyCTL runs LMCache with", in.Family.Name, v, in.Family.Since))
	}
	if in.Family.NoDecisions && in.Dep.API == "decisions" {
		return off("decisions", fmt.Sprintf("%s fails with LMCache while its radix cache is disabled, as decision models run (sgl-project/sglang#45929)", in.Family.Name))
	}
	var lmv string
	if in.Venv != nil {
		if d, ok := in.Venv.Dist(LMCacheDist); ok {
			lmv = d.Version
		}
	}
	switch {
	case lmv == "":
		return off("not_installed", fmt.Sprintf("LMCache is not installed in the environment of engine %s (install lmcache %s or a later 0.5.x there and register the engine again)", in.Inst.Name, LMCacheMin))
	case !VersionIn(lmv, LMCacheSeries) || !VersionAtLeast(lmv, LMCacheMin):
		return off("lmcache_version", fmt.Sprintf("engine %s has LMCache %s; CapyCTL runs %s or a later 0.5.x", in.Inst.Name, lmv, LMCacheMin))
	}
	if in.OwnConnector {
		return off("own_connector", "the deployment sets its own KV connector (--kv-transfer-config)")
	}
	if in.Residency != enginekit.ResidencyRestartOnly {
		// Deep (and host_backed) parking with LMCache is qualified per
		// engine, model type and GPU; this release qualifies none.
		return off("residency_not_qualified", fmt.Sprintf("residency %q is not qualified with LMCache yet: declare residency = \"restart_only\" to use it", in.Residency))
	}
	if !in.Isolated {
		// IMPORTANT: never on the host's loopback (LMCacheIsolationNeeded).
		return off("not_isolated", LMCacheIsolationNeeded)
	}
	if mode == LMCacheRequired && len(*r) > 0 {
		return LMCacheDecision{Plan: &sdk.LMCachePlan{Reason: "refused"}}
	}
	pool := in.Dep.LMCachePoolBytes
	if pool <= 0 {
		pool = DefaultLMCachePool
	}
	p := &sdk.LMCachePlan{
		Runs:        true,
		Reason:      fmt.Sprintf("LMCache %s, residency restart_only, lmcache = %q", lmv, mode),
		PoolBytes:   pool,
		ServerBytes: LMCacheServerBytes,
	}
	dec := LMCacheDecision{Plan: p}
	port := in.Launch.LMCachePort
	if port <= 0 || in.Venv == nil {
		return dec // rendered once the core leased the port
	}
	ps := strconv.Itoa(int(port))
	p.Argv = []string{in.Venv.Python, "-u", "-m", LMCacheModule, "127.0.0.1", ps, "cpu"}
	p.Env = map[string]string(BaseEnv(EnvOptions{Venv: in.Venv.Dir, Host: in.Host, Launch: in.Launch}))
	// The server needs no GPU.
	delete(p.Env, "CUDA_VISIBLE_DEVICES")
	delete(p.Env, "CUDA_DEVICE_ORDER")
	dec.Env = map[string]string{
		"LMCACHE_CHUNK_SIZE":         strconv.Itoa(LMCacheChunkTokens),
		"LMCACHE_LOCAL_CPU":          "True",
		"LMCACHE_MAX_LOCAL_CPU_SIZE": gigabytes(pool),
		"LMCACHE_REMOTE_URL":         "lm://127.0.0.1:" + ps,
		"LMCACHE_REMOTE_SERDE":       "naive",
		// IMPORTANT: without it a restart_only park loses the cache in
		// all but name (LMCacheHashSeed).
		"PYTHONHASHSEED": LMCacheHashSeed(in.Launch.InstanceID, port),
	}
	return dec
}

// LMCacheHashSeed is the PYTHONHASHSEED of every engine launch of an
// instance that runs its LMCache server on port. LMCache keys each chunk
// by a hash chained from a seed (ChunkedTokenDatabase in
// lmcache/v1/token_database.py starts from vLLM's NONE_HASH, which
// init_none_hash in vllm/v1/core/kv_cache_utils.py draws from os.urandom
// unless PYTHONHASHSEED is set; LMCache warns "Centralized cache sharing
// detected but PYTHONHASHSEED not set", and vllm-project/vllm#21161 aligns
// it for the same reason). Unset, the engine launched after a restart_only
// park would look up keys its previous process never wrote. The seed is
// the same for every launch that reaches the same server (the instance
// and the server's port, kept while the server lives) and differs between
// instances. It is no secret: like PYTHONHASHSEED=0, which LMCache's docs
// suggest, it turns off Python's per-process string-hash randomisation in
// the engine. IMPORTANT: it is not enough on Python before 3.12, whose
// hash(None), part of LMCache's builtin chunk hash, is an address
// (python/cpython#99541 made it constant in 3.12).
func LMCacheHashSeed(instanceID string, port int32) string {
	sum := sha256.Sum256([]byte("capyctl-lmcache-hash-seed\x00" + instanceID + "\x00" + strconv.Itoa(int(port))))
	return strconv.FormatUint(uint64(binary.BigEndian.Uint32(sum[:4])), 10)
}

// gigabytes renders bytes as LMCache's size in GB (float, 2^30 bytes).
func gigabytes(b int64) string {
	return strconv.FormatFloat(float64(b)/float64(1<<30), 'f', -1, 64)
}

// ApplyLMCache puts a decision into a rendered plan: the server, the
// engine's variables and the host RAM beside the engine.
func ApplyLMCache(resp *sdk.PlanResponse, d LMCacheDecision) {
	if d.Plan != nil {
		resp.LMCache = *d.Plan
	}
	if !d.Runs() {
		if d.Plan.Reason != "" {
			resp.Notes = append(resp.Notes, "no LMCache: "+d.Plan.Reason)
		}
		return
	}
	if resp.Env == nil {
		resp.Env = map[string]string{}
	}
	for k, v := range d.Env {
		resp.Env[k] = v
	}
	resp.Hints.BesideHostBytes = d.Plan.PoolBytes + d.Plan.ServerBytes
	resp.Notes = append(resp.Notes, "a private LMCache server runs beside the engine on loopback: "+d.Plan.Reason)
}

// SaltWithLMCache turns cache_salt off on the endpoint of an instance that
// runs its LMCache server: LMCache's external keys do not carry the salt
// (vLLM's LMCacheConnectorV1: LMCache/LMCache#2878, the fix #3008 closed
// unmerged; SGLang: sgl-project/sglang#37160 and LMCache/LMCache#4825, both
// open in 2026-09), so two salts would share cached prefixes. The router
// then refuses a salted request (cache_salt_unsupported) instead of
// promising an isolation the cache does not give.
func SaltWithLMCache(ep *sdk.Endpoint, lmcache bool) {
	if lmcache && ep != nil {
		ep.CacheSalt = false
	}
}
