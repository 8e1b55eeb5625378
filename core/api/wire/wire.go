// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package wire holds the management API's request and response types, shared
// by the server (core/api) and the Go client (core/api/client). It imports
// only core/structs' pure types, so a controller program can use the client
// without pulling in the core.
package wire

import (
	"fmt"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// APIVersion is the management API's version.
const APIVersion = "1"

// Prefix is the management API's path prefix.
const Prefix = "/management/v1"

// ErrorEnvelope is every management error answer.
type ErrorEnvelope struct {
	APIVersion string    `json:"api_version"`
	Error      ErrorBody `json:"error"`
}

// ErrorBody is the error inside the envelope.
type ErrorBody struct {
	Code      string         `json:"code"`
	Message   string         `json:"message"`
	Retryable bool           `json:"retryable"`
	Details   map[string]any `json:"details,omitempty"`
}

// DeployRequest creates a deployment or writes a new revision of it.
type DeployRequest struct {
	Deployment structs.Deployment `json:"deployment"`
	// Activate starts it once written.
	Activate bool `json:"activate,omitempty"`
	// ExpectedRevision is the revision an update replaces: a
	// compare-and-set (revision_conflict when another is current). 0 on a
	// PUT applies the spec to whatever revision is current, creating the
	// deployment when it does not exist; 0 on a POST creates one.
	ExpectedRevision uint64 `json:"expected_revision,omitempty"`
}

// DeployAccepted answers a deploy.
type DeployAccepted struct {
	APIVersion string `json:"api_version"`
	Name       string `json:"name"`
	Revision   uint64 `json:"revision"`
	Created    bool   `json:"created"`
	// Unchanged is set when the deployment's spec was already the one
	// asked for: nothing was written, no instance restarted, the revision
	// stayed.
	Unchanged bool   `json:"unchanged,omitempty"`
	Desired   string `json:"desired"`
	// Replayed is set by the Go client when the answer was replayed from
	// an earlier request with the same Idempotency-Key.
	Replayed bool `json:"replayed,omitempty"`
}

// ActionRequest is an action on a deployment or an instance.
type ActionRequest struct {
	// Action is start, stop, park or delete (delete: deployments only).
	Action string `json:"action"`
	// Evict lets a start make room by parking or stopping idle models
	// (start only).
	Evict bool `json:"evict,omitempty"`
	// Wait makes the call return when the action completed (or failed).
	Wait bool `json:"wait,omitempty"`
	// ExpectedRevision, when set, must be the current revision.
	ExpectedRevision uint64 `json:"expected_revision,omitempty"`
}

// ActionAccepted answers an action.
type ActionAccepted struct {
	APIVersion string    `json:"api_version"`
	Deployment string    `json:"deployment"`
	Instance   *int      `json:"instance,omitempty"`
	Action     string    `json:"action"`
	Revision   uint64    `json:"revision"`
	AcceptedAt time.Time `json:"accepted_at"`
	// Done is true when the action completed before the answer.
	Done bool `json:"done"`
	// Replayed is set by the Go client when the answer was replayed from
	// an earlier request with the same Idempotency-Key.
	Replayed bool `json:"replayed,omitempty"`
}

// ErrorDetailsResnapshot is the details key of a cursor_expired answer: the
// client takes a new snapshot and follows the stream from its cursor.
const ErrorDetailsResnapshot = "resnapshot_required"

// DeploymentStatus is a deployment and its instances.
type DeploymentStatus struct {
	Name     string   `json:"name"`
	Engine   string   `json:"engine"`
	API      string   `json:"api"`
	Routes   []string `json:"routes"`
	Revision uint64   `json:"revision"`
	Desired  string   `json:"desired"`
	// State aggregates the instances: ready, degraded, starting, waking,
	// parked, stopping, stopped, failed.
	State     string              `json:"state"`
	ReadyN    int                 `json:"ready"`
	Instances []InstanceStatus    `json:"instances"`
	Spec      *structs.Deployment `json:"spec,omitempty"`
	UpdatedAt time.Time           `json:"updated_at"`
	// Memory is the ledger's view of the deployment, when a ledger runs.
	Memory map[string]any `json:"memory,omitempty"`
	// Requests are the router's counts for the deployment.
	Requests map[string]any `json:"requests,omitempty"`
	// Group is set for one model across several machines (a server's
	// answer): the instances are then its members, in rank order.
	Group *GroupStatus `json:"group,omitempty"`
}

// GroupStatus is a group's part of its status.
type GroupStatus struct {
	// Size is the number of members (hosts); Hosts are in rank order.
	Size             int      `json:"size"`
	Hosts            []string `json:"hosts"`
	TensorParallel   int      `json:"tensor_parallel"`
	PipelineParallel int      `json:"pipeline_parallel"`
	// Rendezvous is where the ranks meet: the head host's peer address
	// and rendezvous port.
	Rendezvous string `json:"rendezvous"`
	// PeerTransport is "unauthenticated": the engines' own group traffic
	// (rendezvous, collectives) carries no authentication.
	PeerTransport string `json:"peer_transport"`
	// LastError is why the server last stopped the group (a failed
	// member, a stalled bring-up, a failed park or wake).
	LastError *structs.ErrorRecord `json:"last_error,omitempty"`
}

// InstanceStatus is one instance.
type InstanceStatus struct {
	ID    string `json:"id"`
	Index int    `json:"index"`
	// Host is the host that runs the instance (a server's answer; a
	// standalone role leaves it empty).
	Host           string               `json:"host,omitempty"`
	State          string               `json:"state"`
	Since          time.Time            `json:"since"`
	Revision       uint64               `json:"revision"`
	Generation     uint64               `json:"generation"`
	Engine         string               `json:"engine,omitempty"`
	Driver         string               `json:"driver,omitempty"`
	Residency      string               `json:"residency,omitempty"`
	Port           int                  `json:"port,omitempty"`
	PID            int                  `json:"pid,omitempty"`
	Endpoint       string               `json:"endpoint,omitempty"`
	LastTransition string               `json:"last_transition,omitempty"`
	LastError      *structs.ErrorRecord `json:"last_error,omitempty"`
	Released       string               `json:"released,omitempty"`
	Charges        map[string]int64     `json:"charges,omitempty"`
	Phase          string               `json:"phase,omitempty"`
	// ParkTier is the tier a parked instance parked at: "host_backed"
	// (weights kept in host RAM; vLLM's sleep level 1) or "deep" (weights
	// dropped; level 2); ParkDetail is the driver's word on it.
	ParkTier   string `json:"park_tier,omitempty"`
	ParkDetail string `json:"park_detail,omitempty"`
	// Timings are the instance's measured start, wake (by tier), park and
	// stop durations, which switching weighs.
	Timings *structs.Timings `json:"timings,omitempty"`
	// Parsers are the tool-call and reasoning parsers the engine runs with.
	Parsers *structs.Parsers `json:"parsers,omitempty"`
	// Exposure is who besides CapyCTL can reach the engine's routes.
	Exposure *structs.Exposure `json:"exposure,omitempty"`
	// Rank and Role are a group member's ("head" serves the API, the
	// others are "worker"s); absent outside groups.
	Rank *int   `json:"rank,omitempty"`
	Role string `json:"role,omitempty"`
}

// DeploymentList answers GET /deployments.
type DeploymentList struct {
	APIVersion  string             `json:"api_version"`
	Deployments []DeploymentStatus `json:"deployments"`
}

// Engine is a registered engine (never secrets).
type Engine struct {
	Name      string            `json:"name"`
	Family    string            `json:"family"`
	Version   string            `json:"version"`
	Verified  bool              `json:"verified"`
	Path      string            `json:"path"`
	Program   string            `json:"program,omitempty"`
	Digest    string            `json:"digest"`
	Details   map[string]string `json:"details,omitempty"`
	Approvals structs.Approvals `json:"approvals"`
	AddedAt   time.Time         `json:"added_at"`
	UsedBy    []string          `json:"used_by,omitempty"`
}

// EngineList answers GET /engines.
type EngineList struct {
	APIVersion string   `json:"api_version"`
	Engines    []Engine `json:"engines"`
	// Hint says how to add an engine when none is registered.
	Hint string `json:"hint,omitempty"`
}

// EngineAddRequest registers an installation. With DryRun the server only
// detects it and answers what it would register (for the confirmation).
type EngineAddRequest struct {
	Name   string `json:"name"`
	Family string `json:"family,omitempty"`
	Path   string `json:"path"`
	// Manifest is a custom engine's manifest (HCL text).
	Manifest string `json:"manifest,omitempty"`
	// ManifestFile names the manifest's file, for diagnostics.
	ManifestFile string            `json:"manifest_file,omitempty"`
	Approvals    structs.Approvals `json:"approvals"`
	Env          map[string]string `json:"env,omitempty"`
	// ExpectDigest, when set, must equal the detected digest (the digest the
	// operator confirmed).
	ExpectDigest string `json:"expect_digest,omitempty"`
	DryRun       bool   `json:"dry_run,omitempty"`
}

// EngineDetected answers an add (dry run or not).
type EngineDetected struct {
	APIVersion       string            `json:"api_version"`
	Engine           Engine            `json:"engine"`
	ToolchainMissing []string          `json:"toolchain_missing,omitempty"`
	Notes            []string          `json:"notes,omitempty"`
	Registered       bool              `json:"registered"`
	Details          map[string]string `json:"details,omitempty"`
}

// FlagRule is one row of an engine family's flag policy.
type FlagRule struct {
	Name     string   `json:"name"`
	Kind     string   `json:"kind"`
	Class    string   `json:"class"`
	Reason   string   `json:"reason"`
	Approval string   `json:"approval,omitempty"`
	Aliases  []string `json:"aliases,omitempty"`
}

// FlagTable answers GET /engines/flags/{family}.
type FlagTable struct {
	APIVersion string     `json:"api_version"`
	Family     string     `json:"family"`
	Rules      []FlagRule `json:"rules"`
}

// Snapshot is the whole state at one event cursor.
type Snapshot struct {
	APIVersion  string             `json:"api_version"`
	Cursor      string             `json:"cursor"`
	TakenAt     time.Time          `json:"taken_at"`
	Role        RoleInfo           `json:"role"`
	Deployments []DeploymentStatus `json:"deployments"`
	Engines     []Engine           `json:"engines"`
	Hosts       []Host             `json:"hosts"`
	// RequestLedger is the request ledger's writer, when the role keeps
	// one.
	RequestLedger *RequestLedgerStatus `json:"request_ledger,omitempty"`
}

// RequestLedgerStatus is the request ledger's writer: records are
// group-committed off the hot path, and lost (never waited for) when its
// queue is full or a commit fails.
type RequestLedgerStatus struct {
	Enabled bool `json:"enabled"`
	// Dropped counts the records lost since the role started.
	Dropped uint64 `json:"dropped"`
	// LastError is the last failed commit, if any.
	LastError string `json:"last_error,omitempty"`
}

// RoleInfo describes the running role.
type RoleInfo struct {
	Role      string    `json:"role"`
	Version   string    `json:"version"`
	Commit    string    `json:"commit"`
	Host      string    `json:"host"`
	Inference string    `json:"inference"`
	StartedAt time.Time `json:"started_at"`
	PID       int       `json:"pid"`
	// TLS is true when the inference endpoint serves TLS, and
	// ClientCertificates when it requires a client certificate.
	TLS                bool `json:"tls,omitempty"`
	ClientCertificates bool `json:"client_certificates,omitempty"`
	// Warnings are what the operator should fix (a non-loopback inference
	// endpoint without TLS).
	Warnings []string `json:"warnings,omitempty"`
	// GPU is what a role that runs engines found of its machine's GPUs;
	// nil on a server, which runs none.
	GPU *GPUInventory `json:"gpu,omitempty"`
	// ModelsRoot is where a role that runs engines keeps its models
	// (models_root): relative model paths and downloads.
	ModelsRoot string `json:"models_root,omitempty"`
}

// GPUInventory is what a role found of its machine's GPUs at start: every
// GPU with its model and memory and the driver's version, or why there is
// none ("no GPU found (...)").
type GPUInventory struct {
	// Provider is nvml, simulated or none (gpu.provider, auto resolved).
	Provider string `json:"provider"`
	// Driver is the NVIDIA driver's version (nvml).
	Driver string `json:"driver,omitempty"`
	// Devices are the GPUs found.
	Devices []GPU `json:"devices"`
	// NoGPU is why no GPU was found, when Devices is empty.
	NoGPU string `json:"no_gpu,omitempty"`
}

// Lines describes the inventory for people: one line per GPU ("0: NVIDIA
// H100 80GB HBM3, 80GiB, driver 550.54.15"), or "no GPU found (<why>)".
func (g GPUInventory) Lines() []string {
	if len(g.Devices) == 0 {
		why := g.NoGPU
		if why == "" {
			why = "none listed"
		}
		return []string{"no GPU found (" + why + ")"}
	}
	out := make([]string, 0, len(g.Devices))
	for _, d := range g.Devices {
		mem := structs.FormatBytes(d.TotalBytes)
		if d.Unified {
			mem = "unified memory"
		}
		line := fmt.Sprintf("%d: %s, %s", d.Index, d.Name, mem)
		switch {
		case g.Driver != "":
			line += ", driver " + g.Driver
		case g.Provider == "simulated":
			line += " (simulated)"
		}
		out = append(out, line)
	}
	return out
}

// Host is a machine that runs engines.
type Host struct {
	Name    string         `json:"name"`
	Online  bool           `json:"online"`
	Role    string         `json:"role"`
	GPUs    []GPU          `json:"gpus,omitempty"`
	Ledger  map[string]any `json:"ledger,omitempty"`
	Engines []string       `json:"engines,omitempty"`
	// The fields below are the server's (several machines); a standalone
	// role leaves them empty.
	//
	// State is ready, draining or lost (HostReady...).
	State string `json:"state,omitempty"`
	// Address is the host's address as the server sees its link.
	Address string `json:"address,omitempty"`
	// Version is the host's CapyCTL version.
	Version string `json:"version,omitempty"`
	// ChargedBytes is what the host's ledger charges, all domains
	// together, as its last heartbeat said.
	ChargedBytes int64 `json:"charged_bytes,omitempty"`
	// LastSeen is when the server last heard from the host.
	LastSeen *time.Time `json:"last_seen,omitempty"`
	// CertExpiresAt is when the host's current certificate expires (the
	// host renews it by itself at two thirds of its life).
	CertExpiresAt *time.Time `json:"cert_expires_at,omitempty"`
}

// GPU is one device of a host.
type GPU struct {
	Index      int    `json:"index"`
	UUID       string `json:"uuid"`
	Name       string `json:"name"`
	TotalBytes int64  `json:"total_bytes"`
	UsedBytes  int64  `json:"used_bytes"`
	Unified    bool   `json:"unified,omitempty"`
}

// EngineLog answers GET /deployments/{name}/engine-log.
type EngineLog struct {
	APIVersion string `json:"api_version"`
	Deployment string `json:"deployment"`
	Instance   int    `json:"instance"`
	Text       string `json:"text"`
	Truncated  bool   `json:"truncated"`
}

// Event is one frame of the event stream (GET /events), and of nothing
// else: the SSE frame's id is Cursor, its event name Kind.
type Event struct {
	APIVersion string `json:"api_version"`
	// Cursor is "<store incarnation>:<seq>": send it back as Last-Event-ID
	// (or ?after=) to resume after this event.
	Cursor     string         `json:"cursor"`
	Seq        uint64         `json:"seq"`
	RecordedAt time.Time      `json:"recorded_at"`
	Kind       string         `json:"kind"`
	Deployment string         `json:"deployment,omitempty"`
	Instance   string         `json:"instance,omitempty"`
	Payload    map[string]any `json:"payload,omitempty"`
}

// HostList answers GET /hosts.
type HostList struct {
	APIVersion string `json:"api_version"`
	Hosts      []Host `json:"hosts"`
}

// Removed answers a removal (DELETE /engines/{name}).
type Removed struct {
	APIVersion string `json:"api_version"`
	Removed    string `json:"removed"`
}

// EffectiveConfig answers GET /deployments/{name}/effective-config: the
// completed deployment as the lifecycle runs it, where each field came from,
// and each instance's rendered launch, with secrets redacted.
type EffectiveConfig struct {
	APIVersion string `json:"api_version"`
	Deployment string `json:"deployment"`
	Revision   uint64 `json:"revision"`
	// Spec is the completed deployment (engine_config.env values that look
	// like secrets read "<redacted>").
	Spec structs.Deployment `json:"spec"`
	// Provenance maps each field path to "file" (or "api") or "default".
	Provenance map[string]string `json:"provenance"`
	// Instances are the rendered launches, for instances that launched.
	Instances []EffectiveLaunch `json:"instances"`
}

// EffectiveLaunch is one instance's rendered command line and environment.
type EffectiveLaunch struct {
	ID       string            `json:"id"`
	Index    int               `json:"index"`
	Engine   string            `json:"engine,omitempty"`
	Driver   string            `json:"driver,omitempty"`
	Argv     []string          `json:"argv,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	LaunchID string            `json:"launch_id,omitempty"`
}

// ConfigSetting is one role setting with its effective value and where it
// came from (GET /config, `capyctl config show`).
type ConfigSetting struct {
	Path    string `json:"path"`
	Env     string `json:"env"`
	Value   string `json:"value"`
	Default string `json:"default"`
	// From is "default", "file", "env" or "flag".
	From        string `json:"from"`
	Detail      string `json:"detail,omitempty"`
	Description string `json:"description,omitempty"`
}

// RoleConfig answers GET /config: the running role's effective settings.
type RoleConfig struct {
	APIVersion string          `json:"api_version"`
	Role       string          `json:"role"`
	File       string          `json:"file,omitempty"`
	Settings   []ConfigSetting `json:"settings"`
}

// Redacted replaces a secret's value wherever the API shows configuration
// (structs.Deployment.Redacted and its helpers put it there).
const Redacted = structs.Redacted

// Action names accepted by the actions routes.
const (
	ActionStart  = "start"
	ActionStop   = "stop"
	ActionPark   = "park"
	ActionDelete = "delete"
)

// HeaderIdempotencyKey carries a mutation's idempotency key; an answer
// replayed from an earlier identical request carries HeaderReplayed: true.
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderReplayed       = "Idempotent-Replayed"
)
