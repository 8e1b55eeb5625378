// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package structs holds the domain types shared by the core's packages and
// the error-code catalogue. It does no I/O.
package structs

import (
	"encoding/json"
	"time"
)

// Inference APIs a deployment can serve.
const (
	APIChat      = "chat"
	APIDecisions = "decisions"
	// APIEmbeddings is an embedding model's: POST /v1/embeddings only.
	APIEmbeddings = "embeddings"
	// APIRerank is a reranker's (a cross-encoder scoring documents
	// against a query): POST /v1/rerank only.
	APIRerank = "rerank"
)

// APICompletions is the kind of a text completion request (POST
// /v1/completions). It is not a deployment's api: a chat deployment serves
// it beside chat, as every engine that serves chat completions does.
const APICompletions = "completions"

// Residencies: how a deployment parks.
const (
	ResidencyDeep        = "deep"
	ResidencyHostBacked  = "host_backed"
	ResidencyRestartOnly = "restart_only"

	// LMCache modes of a deployment (and "off" on a host).
	LMCacheAuto     = "auto"
	LMCacheOff      = "off"
	LMCacheRequired = "required"
)

// Activation modes.
const (
	ActivationOnDemand = "on_demand"
	ActivationExplicit = "explicit"
)

// Deployment is a completed job spec: every field is set, either by the
// operator's file or by a default, and Provenance says which.
type Deployment struct {
	Name   string `json:"name"`
	Engine string `json:"engine"`
	// API is "chat", "decisions", "embeddings" or "rerank".
	API    string   `json:"api"`
	Routes []string `json:"routes"`
	// Residency is "deep", "host_backed", "restart_only", or "" for the
	// engine's default (resolved at placement).
	Residency string `json:"residency,omitempty"`
	// LMCache is "auto", "off" or "required": whether each instance gets
	// a private LMCache server (SPEC E8).
	LMCache string `json:"lmcache"`
	// LMCachePool is the LMCache pool in host RAM (4 GiB by default).
	LMCachePool ByteSize `json:"lmcache_pool"`
	Instances   int      `json:"instances"`
	// Placement constrains the hosts a server places the instances on
	// (several machines); a standalone role has one host and ignores it.
	Placement *PlacementSpec `json:"placement,omitempty"`
	// Topology runs one model across several machines (a group): one
	// engine rank per host of placement.hosts, head first. Nil on one
	// machine.
	Topology *TopologySpec `json:"topology,omitempty"`
	// Group is this host's member of a group, set by the server when it
	// places one on a host (never in a job spec file).
	Group     *GroupMember  `json:"group,omitempty"`
	Model     ModelSpec     `json:"model"`
	Resources *ResourceSpec `json:"resources,omitempty"`
	Lifecycle LifecycleSpec `json:"lifecycle"`
	// RequestDeadline bounds a request until its first output (queueing,
	// activation and prefill included).
	RequestDeadline Duration     `json:"request_deadline"`
	Timeouts        TimeoutsSpec `json:"timeouts"`
	Limits          LimitsSpec   `json:"limits"`
	EngineConfig    EngineConfig `json:"engine_config"`
	// Provenance maps a field path ("engine_config.max_concurrent_requests")
	// to where its value came from: "file" or "default".
	Provenance map[string]string `json:"provenance,omitempty"`
	// Source is "file:line" of the deployment block, when parsed from HCL.
	Source string `json:"source,omitempty"`
}

// PlacementSpec is the placement block.
type PlacementSpec struct {
	// Hosts are the host names the instances may run on (empty: any).
	Hosts []string `json:"hosts,omitempty"`
}

// TopologySpec is the topology block: the engine's parallelism across the
// group's machines.
type TopologySpec struct {
	TensorParallel   int `json:"tensor_parallel"`
	PipelineParallel int `json:"pipeline_parallel"`
}

// World is tensor_parallel × pipeline_parallel.
func (t *TopologySpec) World() int {
	if t == nil {
		return 1
	}
	return max(t.TensorParallel, 1) * max(t.PipelineParallel, 1)
}

// IsGroup reports whether the deployment runs across several machines.
func (d *Deployment) IsGroup() bool {
	return d.Topology != nil && d.Placement != nil && len(d.Placement.Hosts) >= 2
}

// GroupMember is one host's part of a group, as the server placed it.
type GroupMember struct {
	// ID names the group placement (the server's attempt), so that a
	// member left from an older placement is told apart.
	ID string `json:"id"`
	// Rank is the node rank (0: the head), Size the number of machines.
	Rank int `json:"rank"`
	Size int `json:"size"`
	// HeadAddress is the head host's peer address; RendezvousPort the
	// head's rendezvous port, chosen by the head's host from its
	// rendezvous_ports range (0 in the head's request: its host picks).
	HeadAddress    string `json:"head_address,omitempty"`
	RendezvousPort int    `json:"rendezvous_port,omitempty"`
	// PeerAddress is this member's host's own peer address and
	// RequireRDMA its host's require_rdma (both filled in by the host).
	PeerAddress string `json:"peer_address,omitempty"`
	RequireRDMA bool   `json:"require_rdma,omitempty"`
	// Hosts are the group's hosts in rank order.
	Hosts []string `json:"hosts,omitempty"`
}

// IsHead reports whether the member is the group's head.
func (g *GroupMember) IsHead() bool { return g != nil && g.Rank == 0 }

// ModelSpec says where the weights are.
type ModelSpec struct {
	// Path is a directory under the models root, or an absolute path.
	Path string `json:"path,omitempty"`
	// HF is "org/name" of a Hugging Face repository.
	HF string `json:"hf,omitempty"`
	// Revision pins a Hugging Face commit or names a local revision.
	Revision string `json:"revision,omitempty"`
	// ContentFingerprint is "measured" or "sha256:<hex>".
	ContentFingerprint string `json:"content_fingerprint,omitempty"`
}

// ResourceSpec is a declared memory charge: the short form (GPU, RAM charged
// in every phase but stopped) or per-phase charges.
type ResourceSpec struct {
	GPU    ByteSize               `json:"gpu,omitempty"`
	RAM    ByteSize               `json:"ram,omitempty"`
	Phases map[string]PhaseCharge `json:"phases,omitempty"`
}

// PhaseCharge is a declared charge in one phase (startup, ready, parked).
type PhaseCharge struct {
	GPU ByteSize `json:"gpu"`
	RAM ByteSize `json:"ram"`
}

// LifecycleSpec controls activation and the idle timers.
type LifecycleSpec struct {
	Warm       bool   `json:"warm"`
	Activation string `json:"activation"`
	// ReadyIdleTimeout parks (or stops, when restart only) an idle ready
	// instance; 0 = off.
	ReadyIdleTimeout Duration `json:"ready_idle_timeout,omitempty"`
	// ParkedIdleTimeout stops a parked instance; 0 = off.
	ParkedIdleTimeout Duration `json:"parked_idle_timeout,omitempty"`
}

// TimeoutsSpec bounds lifecycle steps; 0 means derived from the model size.
type TimeoutsSpec struct {
	Initialize Duration `json:"initialize,omitempty"`
	Wake       Duration `json:"wake,omitempty"`
	Stop       Duration `json:"stop,omitempty"`
}

// LimitsSpec are the per-request bounds and the waiting queue.
type LimitsSpec struct {
	// StreamIdle ends a stream with no output for this long after its first
	// output (default 120s).
	StreamIdle Duration `json:"stream_idle"`
	// ClientReadIdle ends a stream whose client accepts nothing for this long
	// (default 10s).
	ClientReadIdle Duration `json:"client_read_idle"`
	// MaxChunkBytes ends a stream on one engine chunk larger than this
	// (default 64KiB).
	MaxChunkBytes ByteSize `json:"max_chunk_bytes"`
	// MaxWaiting bounds the waiting queue of the deployment (default 64).
	MaxWaiting int `json:"max_waiting"`
}

// EngineConfig is the engine_config block.
type EngineConfig struct {
	MaxConcurrentRequests int               `json:"max_concurrent_requests,omitempty"`
	ContextLength         int64             `json:"context_length,omitempty"`
	Dtype                 string            `json:"dtype,omitempty"`
	Quantization          string            `json:"quantization,omitempty"`
	KVCacheDtype          string            `json:"kv_cache_dtype,omitempty"`
	CUDAGraphs            *bool             `json:"cuda_graphs,omitempty"`
	TrustRemoteCode       bool              `json:"trust_remote_code,omitempty"`
	Memory                MemorySpec        `json:"memory"`
	AcceptExtraArgs       bool              `json:"accept_extra_args,omitempty"`
	ExtraArgs             []string          `json:"extra_args,omitempty"`
	Env                   map[string]string `json:"env,omitempty"`
	// Family holds the engine_config.<family> blocks as JSON objects, for
	// the driver of that family to validate.
	Family map[string]json.RawMessage `json:"family,omitempty"`
}

// MemorySpec is engine_config.memory.
type MemorySpec struct {
	Request ByteSize `json:"request,omitempty"`
	KVCache ByteSize `json:"kv_cache,omitempty"`
	Startup ByteSize `json:"startup,omitempty"`
}

// Desired states of a deployment.
const (
	// DesiredOnDemand: started by the first request that names it.
	DesiredOnDemand = "on_demand"
	// DesiredRunning: an operator started it; keep it up.
	DesiredRunning = "running"
	// DesiredStopped: an operator stopped it; requests get 409.
	DesiredStopped = "stopped"
)

// DeploymentRecord is a deployment as stored: its current revision and
// what the operator wants of it.
type DeploymentRecord struct {
	Name      string     `json:"name"`
	Revision  uint64     `json:"revision"`
	Spec      Deployment `json:"spec"`
	Desired   string     `json:"desired"`
	CreatedAt time.Time  `json:"created_at"`
	UpdatedAt time.Time  `json:"updated_at"`
}
