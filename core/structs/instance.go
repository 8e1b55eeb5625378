// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package structs

import (
	"fmt"
	"time"
)

// InstanceState is a state of the instance state machine
// (core/lifecycle/states.go holds the legal transitions).
type InstanceState string

// Instance states.
const (
	StateStopped     InstanceState = "stopped"
	StateStarting    InstanceState = "starting"
	StateReady       InstanceState = "ready"
	StateDraining    InstanceState = "draining"
	StateParking     InstanceState = "parking"
	StateParked      InstanceState = "parked"
	StateWaking      InstanceState = "waking"
	StateStopping    InstanceState = "stopping"
	StateFailed      InstanceState = "failed"
	StateReconciling InstanceState = "reconciling"
)

// InstanceID names an instance: "<deployment>/<index>".
func InstanceID(deployment string, index int) string {
	return fmt.Sprintf("%s/%d", deployment, index)
}

// ProcessIdentity identifies a process across PID reuse.
type ProcessIdentity struct {
	PID        int    `json:"pid"`
	StartTicks uint64 `json:"start_ticks"`
	Role       string `json:"role"`
}

// LaunchRecord is what the core records of one launch, before and after
// the engine runs, so a restarted core can find it again.
type LaunchRecord struct {
	LaunchID  string            `json:"launch_id"`
	Pgid      int               `json:"pgid"`
	Processes []ProcessIdentity `json:"processes"`
	Port      int               `json:"port"`
	// LMCachePort is the loopback port of the instance's private LMCache
	// server the launch connects to, 0 when it runs none (the server is
	// InstanceRecord.LMCache).
	LMCachePort int       `json:"lmcache_port,omitempty"`
	LaunchDir   string    `json:"launch_dir"`
	StartedAt   time.Time `json:"started_at"`
	DeviceUUIDs []string  `json:"device_uuids,omitempty"`
	// EngineKey and AdminKey are this launch's secrets. They live only in
	// the owner-only store and the engine's environment.
	EngineKey string `json:"engine_key"`
	AdminKey  string `json:"admin_key,omitempty"`
	// Argv and Env are the rendered launch (secrets excluded).
	Argv []string          `json:"argv,omitempty"`
	Env  map[string]string `json:"env,omitempty"`
}

// EngineEndpoint tells the router how to reach a ready engine.
type EngineEndpoint struct {
	BaseURL         string `json:"base_url"`
	AuthHeader      string `json:"auth_header,omitempty"`
	AuthValue       string `json:"auth_value,omitempty"`
	ChatPath        string `json:"chat_path"`
	DecisionsPath   string `json:"decisions_path,omitempty"`
	CompletionsPath string `json:"completions_path,omitempty"` // empty: /v1/completions
	RequestIDField  string `json:"request_id_field,omitempty"`
	RequestIDHeader string `json:"request_id_header,omitempty"`
	// AbortByID is true when the driver must be asked to abort a request
	// (beyond closing the connection).
	AbortByID  bool   `json:"abort_by_id,omitempty"`
	ServedName string `json:"served_name"`
	// ForwardNonStreamed is true when the engine stops a non-streamed
	// request as soon as its connection closes: the router then forwards
	// such a request as it is instead of streaming it from the engine and
	// assembling the answer (the driver's non_streamed_hangup).
	ForwardNonStreamed bool `json:"forward_non_streamed,omitempty"`
	// CacheSalt is true when the engine takes a request's cache_salt (the
	// router forwards a digest of the deployment, its revision and the
	// salt).
	CacheSalt bool `json:"cache_salt,omitempty"`
	// MessagesPath, CountTokensPath and ResponsesPath are the engine's own
	// routes for Anthropic's Messages API, its token count, and OpenAI's
	// Responses API, where the driver lets the engine serve them (empty:
	// the router translates Messages and Responses requests to chat and
	// refuses count_tokens with count_tokens_unsupported).
	MessagesPath    string `json:"messages_path,omitempty"`
	CountTokensPath string `json:"count_tokens_path,omitempty"`
	ResponsesPath   string `json:"responses_path,omitempty"`
	// Exposure says who besides CapyCTL reaches the engine (nil from a
	// driver that does not say).
	Exposure *Exposure `json:"exposure,omitempty"`
}

// Exposure is who besides CapyCTL can reach an engine's routes, as its
// driver reports it.
type Exposure struct {
	// Listener is "unix" (a socket in the 0700 launch directory: only the
	// role's user), "netns" (a network namespace of the engine's own: only
	// the role's user, root) or "tcp" (the loopback port: every local user).
	Listener string `json:"listener"`
	// OpenRoutes answer any local user without the key ("*": every route).
	OpenRoutes []string `json:"open_routes,omitempty"`
	// Note says why the engine is on TCP, or what else is open.
	Note string `json:"note,omitempty"`
}

// ErrorRecord is a stored error.
type ErrorRecord struct {
	Code    Code      `json:"code"`
	Message string    `json:"message"`
	At      time.Time `json:"at"`
}

// InstanceRecord is an instance as stored.
type InstanceRecord struct {
	Deployment string        `json:"deployment"`
	Index      int           `json:"index"`
	Revision   uint64        `json:"revision"`
	Generation uint64        `json:"generation"`
	State      InstanceState `json:"state"`
	Since      time.Time     `json:"since"`
	// Engine is the registration name the instance runs on; Driver its family.
	Engine    string        `json:"engine"`
	Driver    string        `json:"driver"`
	Residency string        `json:"residency,omitempty"`
	Launch    *LaunchRecord `json:"launch,omitempty"`
	// LMCache is the instance's private LMCache server, a launch of its
	// own (its Port the server's loopback port), nil when it runs none. It
	// belongs to the instance, not to Launch: a restart_only park stops
	// the engine and keeps it, and the next launch reconnects to it.
	LMCache  *LaunchRecord   `json:"lmcache_server,omitempty"`
	Endpoint *EngineEndpoint `json:"endpoint,omitempty"`
	// Canary is the answer to the fixed canary prompt at first readiness.
	Canary    string       `json:"canary,omitempty"`
	LastError *ErrorRecord `json:"last_error,omitempty"`
	// LastTransition describes the last state change ("ready -> draining:
	// switch for B").
	LastTransition string `json:"last_transition,omitempty"`
	// Released says why the instance last gave up its memory ("parked",
	// "stopped (no room to park)").
	Released string `json:"released,omitempty"`
	Attempts int    `json:"attempts,omitempty"`
	// Host is the host the instance runs on.
	Host string `json:"host,omitempty"`
	// Domains / charges live in the ledger; the store keeps the last
	// committed charges for recovery.
	Charges map[string]int64 `json:"charges,omitempty"`
	// Phase is the ledger phase the charges belong to.
	Phase      string    `json:"phase,omitempty"`
	LastUsedAt time.Time `json:"last_used_at,omitempty"`
	// Parsers are the tool-call and reasoning parsers the launch renders.
	Parsers *Parsers `json:"parsers,omitempty"`
	// ParkTier is the tier the instance is parked at, chosen at each park
	// ("host_backed": weights kept in host RAM, vLLM's sleep level 1;
	// "deep": weights dropped, level 2); empty when it is not parked.
	ParkTier string `json:"park_tier,omitempty"`
	// ParkDetail is the driver's word on the park ("asleep at level 1
	// (host_backed)").
	ParkDetail string `json:"park_detail,omitempty"`
	// Timings are the measured durations of the instance's lifecycle steps,
	// what a switch's cost and a waiting request's estimate use.
	Timings *Timings `json:"timings,omitempty"`
}

// Timings are an instance's measured step durations in milliseconds, each
// a moving average of its last measurements (0: never measured).
type Timings struct {
	// StartMs is a launch's time from starting to ready (a cold start).
	StartMs int64 `json:"start_ms,omitempty"`
	// WakeMs is a wake's time from waking to ready, by the tier it woke
	// from.
	WakeMs map[string]int64 `json:"wake_ms,omitempty"`
	// ParkMs is a park's time from parking to parked (the drain before it
	// excluded).
	ParkMs int64 `json:"park_ms,omitempty"`
	// StopMs is a stop's time from stopping to stopped.
	StopMs int64 `json:"stop_ms,omitempty"`
}

// timingAlpha weighs the newest measurement in a moving average.
const timingAlpha = 0.5

// Blend folds a new measurement into a moving average (the first one is
// taken as it is).
func Blend(avg, ms int64) int64 {
	if ms <= 0 {
		return avg
	}
	if avg <= 0 {
		return ms
	}
	return int64(timingAlpha*float64(ms) + (1-timingAlpha)*float64(avg))
}

// Clone copies the timings.
func (t *Timings) Clone() *Timings {
	if t == nil {
		return nil
	}
	c := *t
	if t.WakeMs != nil {
		c.WakeMs = make(map[string]int64, len(t.WakeMs))
		for k, v := range t.WakeMs {
			c.WakeMs[k] = v
		}
	}
	return &c
}

// WaitEstimate is what a request for a model that is not in memory can
// expect: how long until it is served, which models hold the memory it
// needs, and how many models' turns come first. The lifecycle computes it
// from the measured step durations and the queues; the router uses it for
// a refusal's Retry-After and a waiting stream's progress.
type WaitEstimate struct {
	// Wait is the expected time until the model serves (0: unknown), with
	// placeholders for steps never measured.
	Wait time.Duration
	// Floor is the part of Wait that measured figures alone give (steps
	// never measured count 0): a request is refused only when this is past
	// its deadline, never on a placeholder.
	Floor time.Duration
	// Holding are the deployments whose memory the model needs, busy or
	// not.
	Holding []string
	// Ahead is the number of models whose turn comes first.
	Ahead int
	// Switch is true when the model needs another one out of memory.
	Switch bool
}

// Parsers says which tool-call and reasoning parsers an engine runs with,
// and why (declared, off, extra_args, model_family, unknown_family,
// unsupported).
type Parsers struct {
	ToolCall   string `json:"tool_call,omitempty"`
	Reasoning  string `json:"reasoning,omitempty"`
	Provenance string `json:"provenance,omitempty"`
}

// ID returns "<deployment>/<index>".
func (r *InstanceRecord) ID() string { return InstanceID(r.Deployment, r.Index) }
