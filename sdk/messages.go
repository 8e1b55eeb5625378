// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package sdk

// The driver protocol's messages as Go types, one per message of
// sdk/proto/driverv1/driver.proto (whose comments are the contract), field
// for field. A driver and the core use only these; sdk/plugin converts them
// to and from the generated messages at the gRPC boundary. Conventions: a
// nested message is a value, zero when absent, except where its absence
// means something (Deployment.Group, the LMCache server launches,
// StopRequest.Launch): those are pointers, nil when absent. Durations are
// time.Duration (the wire carries milliseconds).

import (
	"strconv"
	"time"
)

// AbortMode says how a request is stopped on the engine.
type AbortMode int32

const (
	// AbortModeUnspecified is a driver that did not say.
	AbortModeUnspecified AbortMode = 0
	// AbortModeCloseConnection: closing the engine connection stops the request.
	AbortModeCloseConnection AbortMode = 1
	// AbortModeRequestID: the engine also needs an explicit abort by request ID.
	AbortModeRequestID AbortMode = 2
)

// String returns the protocol name of the value ("ABORT_MODE_CLOSE_CONNECTION").
func (v AbortMode) String() string {
	switch v {
	case AbortModeUnspecified:
		return "ABORT_MODE_UNSPECIFIED"
	case AbortModeCloseConnection:
		return "ABORT_MODE_CLOSE_CONNECTION"
	case AbortModeRequestID:
		return "ABORT_MODE_REQUEST_ID"
	}
	return "ABORT_MODE_" + strconv.Itoa(int(v))
}

// NonStreamedHangup says how promptly the engine stops a request whose
// client asked for one whole answer (no stream) and went away. It decides
// how the router forwards such a request: as it is (the engine does the
// least work), or as a stream it assembles itself (the only way some
// engines notice a hang-up).
type NonStreamedHangup int32

const (
	// NonStreamedHangupUnspecified: is treated as STREAM: the safe choice for an engine
	// nobody described.
	NonStreamedHangupUnspecified NonStreamedHangup = 0
	// NonStreamedHangupStream: the engine notices a hang-up promptly only while it streams
	// (llama-server b4748 checks a non-streamed client only when no other
	// result arrived for a second: under load, never). The router streams
	// from the engine and assembles the whole answer.
	NonStreamedHangupStream NonStreamedHangup = 1
	// NonStreamedHangupStops: closing the connection (with the abort by request ID where
	// AbortMode says so) stops a non-streamed request as promptly as a
	// streamed one (vLLM's with_cancellation). The router forwards the
	// request as the client sent it.
	NonStreamedHangupStops NonStreamedHangup = 2
)

// String returns the protocol name of the value ("NON_STREAMED_HANGUP_STREAM").
func (v NonStreamedHangup) String() string {
	switch v {
	case NonStreamedHangupUnspecified:
		return "NON_STREAMED_HANGUP_UNSPECIFIED"
	case NonStreamedHangupStream:
		return "NON_STREAMED_HANGUP_STREAM"
	case NonStreamedHangupStops:
		return "NON_STREAMED_HANGUP_STOPS"
	}
	return "NON_STREAMED_HANGUP_" + strconv.Itoa(int(v))
}

// FlagClass is the policy class of one option or environment name.
type FlagClass int32

const (
	// FlagClassUnspecified is a rule without a class.
	FlagClassUnspecified FlagClass = 0
	// FlagClassOwned: CapyCTL renders it; a deployment may not set it.
	FlagClassOwned FlagClass = 1
	// FlagClassReserved: refused in any spelling, whatever the host approves.
	FlagClassReserved FlagClass = 2
	// FlagClassGated: passed only with a host approval (see FlagRule.approval).
	FlagClassGated FlagClass = 3
	// FlagClassPassed: passed unchanged.
	FlagClassPassed FlagClass = 4
)

// String returns the protocol name of the value ("FLAG_CLASS_OWNED").
func (v FlagClass) String() string {
	switch v {
	case FlagClassUnspecified:
		return "FLAG_CLASS_UNSPECIFIED"
	case FlagClassOwned:
		return "FLAG_CLASS_OWNED"
	case FlagClassReserved:
		return "FLAG_CLASS_RESERVED"
	case FlagClassGated:
		return "FLAG_CLASS_GATED"
	case FlagClassPassed:
		return "FLAG_CLASS_PASSED"
	}
	return "FLAG_CLASS_" + strconv.Itoa(int(v))
}

// FlagKind says whether a rule is about an option or an environment name.
type FlagKind int32

const (
	// FlagKindUnspecified is a rule without a kind.
	FlagKindUnspecified FlagKind = 0
	// FlagKindOption: the rule is about a command-line option.
	FlagKindOption FlagKind = 1
	// FlagKindEnv: the rule is about an environment variable.
	FlagKindEnv FlagKind = 2
)

// String returns the protocol name of the value ("FLAG_KIND_OPTION").
func (v FlagKind) String() string {
	switch v {
	case FlagKindUnspecified:
		return "FLAG_KIND_UNSPECIFIED"
	case FlagKindOption:
		return "FLAG_KIND_OPTION"
	case FlagKindEnv:
		return "FLAG_KIND_ENV"
	}
	return "FLAG_KIND_" + strconv.Itoa(int(v))
}

// ProbeKind says what a Probe checks.
type ProbeKind int32

const (
	// ProbeKindUnspecified is a probe without a kind.
	ProbeKindUnspecified ProbeKind = 0
	// ProbeKindLiveness answers at once from the process table.
	ProbeKindLiveness ProbeKind = 1
	// ProbeKindReadiness waits, up to ProbeRequest.Deadline, until the engine
	// serves its served name and answers a real short request.
	ProbeKindReadiness ProbeKind = 2
	// ProbeKindWakeCheck sends the fixed canary prompt and returns the answer.
	ProbeKindWakeCheck ProbeKind = 3
)

// String returns the protocol name of the value ("PROBE_KIND_LIVENESS").
func (v ProbeKind) String() string {
	switch v {
	case ProbeKindUnspecified:
		return "PROBE_KIND_UNSPECIFIED"
	case ProbeKindLiveness:
		return "PROBE_KIND_LIVENESS"
	case ProbeKindReadiness:
		return "PROBE_KIND_READINESS"
	case ProbeKindWakeCheck:
		return "PROBE_KIND_WAKE_CHECK"
	}
	return "PROBE_KIND_" + strconv.Itoa(int(v))
}

// RecoverState is what Recover found of a recorded instance.
type RecoverState int32

const (
	// RecoverStateUnspecified is a malformed answer (the core refuses it).
	RecoverStateUnspecified RecoverState = 0
	// RecoverStateRunning: the engine runs; the driver holds its handle again.
	RecoverStateRunning RecoverState = 1
	// RecoverStateGone: every recorded process is gone.
	RecoverStateGone RecoverState = 2
	// RecoverStateUncertain: the driver cannot tell (the core retries later).
	RecoverStateUncertain RecoverState = 3
)

// String returns the protocol name of the value ("RECOVER_STATE_RUNNING").
func (v RecoverState) String() string {
	switch v {
	case RecoverStateUnspecified:
		return "RECOVER_STATE_UNSPECIFIED"
	case RecoverStateRunning:
		return "RECOVER_STATE_RUNNING"
	case RecoverStateGone:
		return "RECOVER_STATE_GONE"
	case RecoverStateUncertain:
		return "RECOVER_STATE_UNCERTAIN"
	}
	return "RECOVER_STATE_" + strconv.Itoa(int(v))
}

// DescribeRequest is what the Describe call takes.
type DescribeRequest struct{}

// DescribeResponse is what the Describe call answers.
type DescribeResponse struct {
	// Name is the engine family the driver serves ("vllm", "custom", ...).
	Name string
	// Version is the driver's own version.
	Version string
	// Protocol is the driver protocol version the driver speaks (1).
	Protocol uint32
	// Capabilities are what the driver can do.
	Capabilities Capabilities
	// ConfigSchema is a JSON document naming the keys the driver accepts in
	// engine_config.<family> and their types; informational.
	ConfigSchema string
}

// Capabilities is what the driver and its engine can do; the core reads it
// instead of guessing (a gRPC client "implements" every call).
type Capabilities struct {
	// ParkTiers lists the residencies the engine can park at: "deep",
	// "host_backed". Empty means restart only.
	ParkTiers []string
	// APIs lists the inference APIs the engine can serve: "chat",
	// "decisions".
	APIs []string
	// AbortMode says how the router stops a request on the engine.
	AbortMode AbortMode
	// IdleSignal is true when Load reports running and waiting counts.
	IdleSignal bool
	// Groups is true when one model can span several machines.
	Groups bool
	// LMCache is true when the driver can run a private LMCache per instance.
	LMCache bool
	// RequestIDField names the JSON body field the router sets to its
	// request ID ("rid" for SGLang), empty for none.
	RequestIDField string
	// RequestIDHeader names the header the router sets to its request ID,
	// empty for none.
	RequestIDHeader string
	// TierPerPark is true when any launch can park at any of ParkTiers,
	// the tier chosen at each park (vLLM's sleep levels: level 1 keeps the
	// weights in host RAM, level 2 drops them); the core then parks at
	// host_backed when the host has room for the weights, else deep. False:
	// a launch parks at the residency it was launched for (SGLang keeps a
	// host copy of the weights only when launched host_backed).
	TierPerPark bool
}

// DetectRequest is what the Detect call takes.
type DetectRequest struct {
	// Path is what the operator named: a venv directory, a binary or a
	// program.
	Path string
	// Manifest is the custom-engine manifest (HCL text), custom driver only.
	Manifest string
	// Name is the registration name the operator chose.
	Name string
}

// DetectResponse is what the Detect call answers.
type DetectResponse struct {
	// Family is the engine family found.
	Family string
	// Version is the engine's version.
	Version string
	// Verified is true when the version is in the driver's verified set.
	Verified bool
	// Digest is "sha256:<hex>" over the installation's files or program; the
	// core pins it and refuses a changed installation.
	Digest string
	// Program is the absolute path of what a launch executes.
	Program string
	// ToolchainMissing names build tools the engine needs and that are not on
	// its PATH (TensorFold: ninja, nvcc, a C++ compiler).
	ToolchainMissing []string
	// Notes are remarks for the operator.
	Notes []string
	// Details are family-specific facts to record with the registration
	// (for the custom driver: the parsed manifest as JSON).
	Details map[string]string
}

// FlagsRequest is what the Flags call takes.
type FlagsRequest struct {
	// Version narrows the table to one engine version; empty for all.
	Version string
}

// FlagRule is one row of the flag-policy table.
type FlagRule struct {
	// Name is "--option" for options, the variable name for env; a trailing
	// "*" makes it a prefix ("SGLANG_DUMP*", "--debug-tensor-dump-*").
	Name string
	// Kind says whether Name is an option or an environment name.
	Kind FlagKind
	// Class is the rule's policy class.
	Class FlagClass
	// Reason says why, for `capyctl engine flags`.
	Reason string
	// Approval names the host approval a GATED rule needs: "option", "path",
	// "env", "remote_code".
	Approval string
	// Aliases are other spellings of the same option.
	Aliases []string
}

// FlagsResponse is what the Flags call answers.
type FlagsResponse struct {
	// Family is the engine family of the table.
	Family string
	// Rules are the table's rows.
	Rules []*FlagRule
}

// Installation is a registered engine installation.
type Installation struct {
	// Name is the registration name.
	Name string
	// Family is the engine family.
	Family string
	// Path is the venv directory, binary or program the operator registered.
	Path string
	// Version is the engine version Detect found.
	Version string
	// Verified is true when Version is in the driver's verified set.
	Verified bool
	// Digest is the pinned "sha256:<hex>" of the installation.
	Digest string
	// Details are the family-specific facts Detect recorded.
	Details map[string]string
}

// HostPolicy is what the host (the operator of the machine) allows and sets.
type HostPolicy struct {
	// ApprovedOptions are the gated options the host approves.
	ApprovedOptions []string
	// ApprovedPaths are directory prefixes a path-valued option may name.
	ApprovedPaths []string
	// ApprovedEnv are glob patterns of environment names a deployment may set.
	ApprovedEnv []string
	// AllowRemoteCode is true when the host lets a deployment trust a model's
	// remote code.
	AllowRemoteCode bool
	// EngineTelemetry is "off" (default) or "allow".
	EngineTelemetry string
	// EngineLogs is "file" (default) or "memory".
	EngineLogs string
	// Retention is "standard" or "zero".
	Retention string
	// Unified is true on a unified-memory machine (one memory pool).
	Unified bool
	// HostEnv are variables the host adds to every engine (e.g. the
	// simulated GPU's state file in dev mode); never secrets.
	HostEnv map[string]string
	// CUDAHome is the CUDA toolkit directory, when the host has one.
	CUDAHome string
	// LMCache is "off" when the host runs no LMCache for any deployment;
	// empty leaves it to each deployment.
	LMCache string
}

// Deployment is the completed job spec, as far as a driver needs it.
type Deployment struct {
	// Name is the deployment's name.
	Name string
	// Revision is the deployment's revision.
	Revision uint64
	// API is "chat" or "decisions".
	API string
	// ServedName is the name the engine serves (the public name).
	ServedName string
	// ModelDir is the resolved model directory on this host.
	ModelDir string
	// Residency is "deep", "host_backed", "restart_only", or empty for the
	// driver's default.
	Residency string
	// MaxConcurrentRequests is 0 when the deployment leaves it unset.
	MaxConcurrentRequests int32
	// ContextLength is 0 when unset.
	ContextLength int64
	// Dtype, Quantization and KVCacheDtype are engine_config's settings, empty
	// when unset.
	Dtype        string
	Quantization string
	KVCacheDtype string
	// CUDAGraphs: "" unset, "true" or "false".
	CUDAGraphs string
	// TrustRemoteCode is engine_config.trust_remote_code.
	TrustRemoteCode bool
	// AcceptExtraArgs and ExtraArgs are engine_config's extra arguments and the
	// switch that allows them.
	AcceptExtraArgs bool
	ExtraArgs       []string
	// Env are the variables the deployment sets (checked against the flag
	// policy).
	Env map[string]string
	// EngineConfigJSON is the engine_config.<family> block as a JSON object.
	EngineConfigJSON []byte
	// Resources are the declared charges, when the deployment declares them.
	Resources Resources
	// Memory are engine_config.memory's declared sizes (0 when unset).
	Memory MemorySizes
	// LMCache is "auto" (or empty), "off" or "required": whether the instance
	// gets a private LMCache server (Capabilities.LMCache).
	LMCache string
	// LMCachePoolBytes is the LMCache pool in host RAM, 0 for the
	// driver's default (4 GiB).
	LMCachePoolBytes int64
	// Group is this launch's place in a model run across several machines
	// (one engine rank per host, head first); absent on one machine. Only
	// drivers with Capabilities.Groups are given one.
	Group *Group
}

// Group is one member of a group: the facts a driver renders into the
// engine's own multi-node options. The core decided each of them; the
// driver adds none of its own (no NCCL_* variable, no other address).
type Group struct {
	// Rank is the node rank: 0 is the head, which serves the engine's HTTP
	// API; the others are workers.
	Rank int32
	// Size is the number of machines (ranks) in the group, at least 2.
	Size int32
	// TensorParallel and PipelineParallel are the job spec's topology;
	// their product divides by size (TensorFold: both 2 and 1, size 2).
	TensorParallel   int32
	PipelineParallel int32
	// HeadAddress is the head host's peer address (an IP address or a
	// name on the group's link), RendezvousPort the head's rendezvous port
	// from its host's rendezvous_ports range: the engines meet at
	// HeadAddress:RendezvousPort.
	HeadAddress    string
	RendezvousPort int32
	// PeerAddress is this host's own address on the group's link (the
	// engines' socket interface is chosen from it).
	PeerAddress string
	// RequireRDMA is the host's RequireRDMA setting: the group's traffic
	// must go over RDMA, never fall back to TCP.
	RequireRDMA bool
}

// Resources are a deployment's declared charges.
type Resources struct {
	// Declared is true when the deployment has a resources block.
	Declared bool
	// DeviceBytes and HostBytes are the declared ready charges.
	DeviceBytes int64
	HostBytes   int64
}

// MemorySizes are engine_config.memory's declared sizes.
type MemorySizes struct {
	// RequestBytes, KVCacheBytes and StartupBytes are 0 when unset.
	RequestBytes int64
	KVCacheBytes int64
	StartupBytes int64
}

// LaunchContext is what the core decided for one launch. Absent fields mean
// "not decided yet" (when a deployment is validated at write time).
type LaunchContext struct {
	// Port is the loopback port the core leased.
	Port int32
	// DeviceUUIDs are the GPUs the instance is pinned to.
	DeviceUUIDs []string
	// DeviceBytes is the ready charge the ledger granted on the card (or the
	// unified pool); drivers size the engine's memory flags from it.
	DeviceBytes int64
	// DeviceTotalBytes is the card's (or pool's) capacity.
	DeviceTotalBytes int64
	// KVCacheBytes is the KV budget inside DeviceBytes.
	KVCacheBytes int64
	// LaunchDir is a private directory for this launch (logs, sockets).
	LaunchDir string
	// InstanceID identifies the instance ("<deployment>/<index>").
	InstanceID string
	// LaunchID identifies this launch of the instance.
	LaunchID string
	// LMCachePort is the second loopback port the core leased for the
	// instance's LMCache server, once a plan said it runs one (PlanResponse.
	// lmcache.runs); 0 otherwise.
	LMCachePort int32
	// LMCacheServer is the instance's LMCache server, a launch of its own
	// that belongs to the instance rather than to one engine launch: it
	// outlives a restart_only park, so the next engine launch reconnects to
	// the same cache on the same port (LMCachePort). Start reuses it when
	// its recorded processes still run, and otherwise starts the server anew
	// in its LaunchDir on its port (a first launch names no processes).
	// Absent when the plan runs no LMCache.
	LMCacheServer *Launch
}

// PlanRequest is what the Plan call takes.
type PlanRequest struct {
	// Installation is the engine registration.
	Installation Installation
	// Deployment is the completed job spec.
	Deployment Deployment
	// Host is what the host allows and sets.
	Host HostPolicy
	// Launch is what the core decided for the launch (zero at write time).
	Launch LaunchContext
}

// Refusal is one reason a Plan refuses a deployment.
type Refusal struct {
	// Code is a stable code from CapyCTL's catalogue, optionally with a
	// suffix ("engine_option_reserved:--api-key").
	Code string
	// Message says what is wrong and what to do.
	Message string
	// Field is the job-spec path the refusal is about ("engine_config.extra_args").
	Field string
}

// MemoryHints are the driver's figures for the memory ledger.
type MemoryHints struct {
	// WeightsBytes is the model's weights.
	WeightsBytes int64
	// KVBytesPerToken is the KV cache one token takes.
	KVBytesPerToken int64
	// KVCacheBytes is the KV cache the engine will hold when the driver
	// sizes it itself (llama.cpp: full window per slot).
	KVCacheBytes int64
	// ReadyDeviceBytes / ReadyHostBytes: the driver's own estimate of the
	// ready charge, 0 when it leaves it to the core.
	ReadyDeviceBytes int64
	ReadyHostBytes   int64
	// StartupDeviceBytes: the driver's startup-peak placeholder, 0 for the
	// core's default formula.
	StartupDeviceBytes int64
	// ContextLength and MaxConcurrentRequests are what the launch serves.
	ContextLength         int64
	MaxConcurrentRequests int32
	// Source says where the figures came from ("gguf_header",
	// "safetensors", "declared", ...).
	Source string
	// BesideHostBytes is host RAM held beside the engine for as long as
	// the launch runs (a private LMCache: its pool and its server's own
	// memory); the core adds it to the host side (or the unified pool) of
	// the startup and ready charges, and of the parked one where the
	// process stays.
	BesideHostBytes int64
}

// Parsers are the tool-call and reasoning parsers a launch uses.
type Parsers struct {
	// ToolCall is the tool-call parser, empty for none.
	ToolCall string
	// Reasoning is the reasoning parser, empty for none.
	Reasoning string
	// provenance: declared, off, extra_args, model_family, unknown_family,
	// unsupported.
	Provenance string
}

// PlanResponse is what the Plan call answers.
type PlanResponse struct {
	// Refusals, when any, refuse the deployment; the rest of the answer is then
	// empty.
	Refusals []*Refusal
	// argv[0] is the program; never contains a secret.
	Argv []string
	// Env is the complete engine environment apart from secrets.
	Env map[string]string
	// Workdir is the engine's working directory.
	Workdir string
	// Hints are the figures for the memory ledger.
	Hints MemoryHints
	// Parsers are the parsers the launch uses.
	Parsers Parsers
	// Residency is the effective residency.
	Residency string
	// StartupTimeout and WakeTimeout are the driver's bounds for a start and a
	// wake, 0 for the core's defaults; the wire carries milliseconds.
	StartupTimeout time.Duration
	WakeTimeout    time.Duration
	// Notes are remarks for the operator.
	Notes []string
	// LMCache is the plan's decision about a private LMCache server, absent
	// from drivers without Capabilities.LMCache.
	LMCache LMCachePlan
}

// LMCachePlan is an instance's private LMCache server: a launch of its own
// (its own supervisor and process group) that the driver starts beside the
// engine's on the loopback port the core leased (LaunchContext.LMCachePort)
// and that the instance keeps across restart_only parks
// (LaunchContext.LMCacheServer); Stop ends it when given it.
type LMCachePlan struct {
	// Runs is true when the instance gets its LMCache server.
	Runs bool
	// Reason says why it runs or why not ("residency deep is not qualified
	// with LMCache", "retention = zero", ...).
	Reason string
	// PoolBytes is the KV pool the server keeps in host RAM; ServerBytes
	// is the server's own memory beside it. The core charges both to the
	// host RAM domain (or the unified pool) while the instance holds memory.
	PoolBytes   int64
	ServerBytes int64
	// Argv and env start the server once LMCachePort is known (empty
	// before); never secrets.
	Argv []string
	// Env is the server's environment.
	Env map[string]string
}

// StartRequest is what the Start call takes.
type StartRequest struct {
	// Installation, Deployment, Host and Launch are those the plan was made
	// from.
	Installation Installation
	Deployment   Deployment
	Host         HostPolicy
	Launch       LaunchContext
	// Plan is the rendered launch from Plan.
	Plan PlanResponse
	// EngineKey is this launch's own key; the driver gives it to the engine
	// through the environment, never argv, and redacts it from logs.
	EngineKey string
	// AdminKey is a second per-launch key for control routes, where the
	// engine distinguishes them.
	AdminKey string
}

// ProcessIdentity identifies a process across PID reuse.
type ProcessIdentity struct {
	// Pid is the process ID.
	Pid int32
	// StartTicks is field 22 of /proc/<pid>/stat.
	StartTicks uint64
	// Role is "shim" or "engine".
	Role string
}

// Launch identifies a launch's processes across restarts of the core and the
// driver.
type Launch struct {
	// Pgid is the process group (and session) of the launch.
	Pgid int32
	// Processes are the launch's recorded processes: the supervisor ("shim")
	// and the engine.
	Processes []*ProcessIdentity
	// LaunchDir, Port and LaunchID are the launch's LaunchContext values.
	LaunchDir string
	Port      int32
	LaunchID  string
	// LMCachePort is the loopback port of the launch's LMCache server, 0
	// when it runs none.
	LMCachePort int32
}

// Endpoint tells the router how to reach a ready engine.
type Endpoint struct {
	// BaseURL is "http://127.0.0.1:<port>", or "http+unix://" and the
	// query-escaped path of a Unix socket the engine listens on instead of a
	// port (sdk/engineapi.UnixBaseURL), or "http+netns://" and
	// "<engine pid>.<start ticks>.netns.invalid:<port>" for an engine on
	// 127.0.0.1 in a network namespace of its own (sdk/engineapi.NetnsBaseURL).
	BaseURL string
	// AuthHeader and AuthValue are set on every forwarded request.
	AuthHeader string
	// AuthValue is AuthHeader's value (the engine key).
	AuthValue string
	// ChatPath and DecisionsPath are the engine's routes for the two APIs.
	ChatPath      string
	DecisionsPath string
	// RequestIDField / RequestIDHeader: where the router puts its request
	// ID (see Capabilities).
	RequestIDField  string
	RequestIDHeader string
	// AbortMode says how the router stops a request on this engine.
	AbortMode AbortMode
	// ServedName is the model name the engine expects in requests.
	ServedName string
	// Listener is how the engine listens: "unix" (a socket in the launch
	// directory, 0700: only the role's user reaches any route), "netns" (its
	// port in a network namespace of its own: only root, the role's user,
	// reaches it) or "tcp" (the loopback port: every local user can connect).
	// Empty from drivers that predate it (read as "tcp").
	Listener string
	// OpenRoutes are the routes any local user can call without the key
	// while the engine listens on TCP ("*" for every route: no key); none on
	// a socket.
	OpenRoutes []string
	// ExposureNote says why the engine is not on a socket (its version has
	// no such option, the path is too long) or what else is open to whom.
	ExposureNote string
	// NonStreamedHangup: how the engine learns that the client of a
	// non-streamed request went away (and so how the router forwards one).
	NonStreamedHangup NonStreamedHangup
	// CompletionsPath is the engine's text completions route (OpenAI's
	// POST /v1/completions), which the router sends a chat deployment's text
	// completion requests to; empty means "/v1/completions".
	CompletionsPath string
	// CacheSalt is true when the engine takes a request's CacheSalt in a
	// chat or completions body (vLLM, SGLang): the router then forwards the
	// client's salt as hex(sha256(deployment "\x00" revision "\x00" salt)),
	// so no two deployments share a cache entry. False (every driver that
	// predates it), a request with CacheSalt is refused with
	// cache_salt_unsupported.
	CacheSalt bool
	// MessagesPath, CountTokensPath and ResponsesPath are the engine's
	// own routes for Anthropic's Messages API (POST /v1/messages), its
	// token count (POST /v1/messages/count_tokens) and OpenAI's Responses
	// API (POST /v1/responses), where the driver lets the engine serve them:
	// the router then sends those requests there (the engine renders them)
	// instead of translating them to chat. Empty (every driver that
	// predates them): Messages and Responses requests are translated to
	// chat, and a count_tokens request is refused with
	// count_tokens_unsupported (CapyCTL never estimates a count). A driver
	// names a route only where every release it runs serves it, honours the
	// request ID the way its chat route does, and stops the work when the
	// connection closes.
	MessagesPath    string
	CountTokensPath string
	ResponsesPath   string
}

// StartResponse is what the Start call answers.
type StartResponse struct {
	// Launch is the launch to record.
	Launch Launch
	// Endpoint is how the router reaches the engine once ready.
	Endpoint Endpoint
	// LMCacheServer is the instance's LMCache server the engine connects
	// to (LaunchContext.LMCacheServer, reused or started): the core records
	// it with the instance, not with the engine's launch.
	LMCacheServer *Launch
}

// ProbeRequest is what the Probe call takes.
type ProbeRequest struct {
	// InstanceID names the instance.
	InstanceID string
	// Kind says what to check.
	Kind ProbeKind
	// Deadline bounds a READINESS wait.
	Deadline time.Duration
}

// ProbeResponse is what the Probe call answers.
type ProbeResponse struct {
	// Alive is true while the engine process runs.
	Alive bool
	// Ready is true once the engine serves.
	Ready bool
	// Exited is true when the engine process is gone; ExitCode is its
	// status when known (-1 otherwise).
	Exited   bool
	ExitCode int32
	// Detail says what the probe saw.
	Detail string
	// LastLogLines is the redacted end of the engine's output, for a failed
	// start.
	LastLogLines []string
	// Endpoint is the engine's endpoint once ready (zero before).
	Endpoint Endpoint
	// Canary is the answer to the fixed canary prompt (READINESS on first
	// start, WAKE_CHECK).
	Canary string
	// Code is a catalogue code for a failure ("launch_failed",
	// "engine_listens_off_loopback", "startup_timeout").
	Code string
}

// ParkRequest is what the Park call takes.
type ParkRequest struct {
	// InstanceID names the instance.
	InstanceID string
	// Tier is "deep" or "host_backed".
	Tier string
}

// ParkResponse is what the Park call answers.
type ParkResponse struct {
	// Detail says what the engine did.
	Detail string
	// ResidueBytes is what the engine says it still holds on the device,
	// 0 when unknown (the core measures it anyway).
	ResidueBytes int64
}

// WakeRequest is what the Wake call takes.
type WakeRequest struct {
	// InstanceID names the instance.
	InstanceID string
	// Tier is the tier the instance was parked at.
	Tier string
}

// WakeResponse is what the Wake call answers.
type WakeResponse struct {
	// Canary is the answer to the fixed canary prompt after the wake.
	Canary string
	// Detail says what the engine did.
	Detail string
}

// AbortRequest is what the Abort call takes.
type AbortRequest struct {
	// InstanceID names the instance.
	InstanceID string
	// RequestID is the ID the router sent with the request.
	RequestID string
}

// AbortResponse is what the Abort call answers.
type AbortResponse struct {
	// Mode is how the engine stops a request.
	Mode AbortMode
	// Sent is true when the driver sent an abort to the engine.
	Sent bool
}

// LoadRequest is what the Load call takes.
type LoadRequest struct {
	// InstanceID names the instance.
	InstanceID string
}

// LoadResponse is what the Load call answers.
type LoadResponse struct {
	// Known is false when the engine has no idle signal or did not answer.
	Known bool
	// Running and Waiting are the engine's request counts.
	Running int64
	Waiting int64
	// KVUsage is the KV cache usage fraction, -1 when unknown.
	KVUsage float64
	// Figures are further engine readings by metric name.
	Figures map[string]float64
}

// StopRequest is what the Stop call takes.
type StopRequest struct {
	// InstanceID names the instance.
	InstanceID string
	// Grace is how long the engine may take after the graceful signal.
	Grace time.Duration
	// Launch is the recorded launch, used when the driver has no handle.
	// Absent when only LMCacheServer is to end (an instance parked with its
	// engine already stopped).
	Launch *Launch
	// LMCacheServer is the instance's LMCache server (StartResponse.
	// LMCacheServer): Stop ends it too, after the engine, and gone is true
	// only once both are proven gone. Absent, a server is left running: a
	// restart_only park stops the engine and keeps its cache.
	LMCacheServer *Launch
}

// StopResponse is what the Stop call answers.
type StopResponse struct {
	// Gone is true once every recorded process is proven gone.
	Gone bool
	// Forced is true when the forced signal was needed.
	Forced bool
	// ExitCode is the engine's exit status, -1 when unknown.
	ExitCode int32
	// Cleaned lists what the stop cleaned up (shared memory segments, sockets).
	Cleaned []string
	// Detail says what happened.
	Detail string
}

// RecoverRequest is what the Recover call takes.
type RecoverRequest struct {
	// InstanceID names the instance.
	InstanceID string
	// Launch is the launch the core recorded.
	Launch Launch
	// Installation, Deployment, Host and Context are those of the recorded
	// launch, as far as the core still has them.
	Installation Installation
	Deployment   Deployment
	Host         HostPolicy
	Context      LaunchContext
	// EngineKey and AdminKey are the launch's keys.
	EngineKey string
	AdminKey  string
	// RecordedState is the instance state the core recorded ("ready",
	// "parked", "parking", "waking", "starting", ...), so a fresh driver knows
	// what to expect of the engine.
	RecordedState string
	// ParkTier is the tier the instance was parked at, when parked.
	ParkTier string
}

// RecoverResponse is what the Recover call answers.
type RecoverResponse struct {
	// State is what the driver found.
	State RecoverState
	// Endpoint is the engine's endpoint when running.
	Endpoint Endpoint
	// Detail says what the driver found.
	Detail string
	// Parked is true when the engine reports its memory released (asleep);
	// the core then records the instance parked, not ready.
	Parked bool
	// Launch is the launch as the driver found it (its process identities,
	// possibly read back from the launch directory when the core never
	// recorded them); the core records it.
	Launch Launch
}

// LogsRequest is what the Logs call takes.
type LogsRequest struct {
	// InstanceID names the instance.
	InstanceID string
	// MaxBytes bounds the tail (default 64 KiB).
	MaxBytes int64
	// LaunchDir is used when the driver has no handle.
	LaunchDir string
}

// LogsResponse is what the Logs call answers.
type LogsResponse struct {
	// Text is the redacted tail.
	Text string
	// Truncated is true when older output was left out.
	Truncated bool
}

// WaitExitRequest is what the WaitExit call takes.
type WaitExitRequest struct {
	// InstanceID names the instance.
	InstanceID string
}

// ExitEvent says how an engine process ended (WaitExit).
type ExitEvent struct {
	// Exited is true when the engine process is gone; ExitCode is its
	// status when known (-1 otherwise; a signal's death is 128+signal).
	Exited bool
	// ExitCode is the engine's status.
	ExitCode int32
	// Detail says how it ended.
	Detail string
	// LastLogLines is the redacted end of the engine's output.
	LastLogLines []string
}
