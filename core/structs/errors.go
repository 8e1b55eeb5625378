// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package structs

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Code is a stable refusal or failure code. A code may carry a suffix after
// a colon naming the subject ("engine_env_reserved:VLLM_API_KEY"); the
// catalogue is keyed by the part before the colon.
type Code string

// CodeInfo is one row of the catalogue: the CLI's exit code, and whether a
// client may retry. The HTTP status an API answers with belongs to the API
// (core/api/wire.HTTPStatus).
type CodeInfo struct {
	Code      Code
	Exit      int
	Retryable bool
	Summary   string
}

// The catalogue. IMPORTANT: codes, HTTP statuses and exit codes are a public
// contract (docs, controllers, systemd units); add rows, never renumber. A
// new code adds its row here and its HTTP status in core/api/wire (a test
// there fails on a code without one).
const (
	CodeOK                        Code = "ok"
	CodeInvalidRequest            Code = "invalid_request"
	CodeInvalidConfig             Code = "invalid_config"
	CodeUnauthorized              Code = "unauthorized"
	CodeNotFound                  Code = "not_found"
	CodeUnknownModel              Code = "unknown_model"
	CodeAPIMismatch               Code = "api_mismatch"
	CodeEngineRejected            Code = "engine_rejected"
	CodeUnsupportedParameter      Code = "unsupported_parameter"
	CodeRequestTooLarge           Code = "request_too_large"
	CodeQueueFull                 Code = "queue_full"
	CodeInsufficientResources     Code = "insufficient_resources"
	CodeDeploymentStopped         Code = "deployment_stopped"
	CodeDeploymentInactive        Code = "deployment_inactive"
	CodeConflict                  Code = "conflict"
	CodeRevisionConflict          Code = "revision_conflict"
	CodeIdempotencyConflict       Code = "idempotency_conflict"
	CodeUnavailable               Code = "unavailable"
	CodeShuttingDown              Code = "shutting_down"
	CodeEngineError               Code = "engine_error"
	CodeActivationFailed          Code = "activation_failed"
	CodeActivationTimeout         Code = "activation_timeout"
	CodeInternal                  Code = "internal"
	CodeLaunchFailed              Code = "launch_failed"
	CodeStartupTimeout            Code = "startup_timeout"
	CodeOffLoopback               Code = "engine_listens_off_loopback"
	CodePortConflict              Code = "port_conflict"
	CodeCapacityBlocked           Code = "capacity_blocked"
	CodeInsufficientDevice        Code = "insufficient_device_memory"
	CodeInsufficientMemory        Code = "insufficient_memory"
	CodeStartupNeedsEmptyHost     Code = "startup_requires_empty_host"
	CodeUnsupported               Code = "unsupported"
	CodeCapabilityMissing         Code = "capability_missing"
	CodeHostBackedUnavailable     Code = "host_backed_unavailable"
	CodeLMCacheUnavailable        Code = "lmcache_unavailable"
	CodeStoreFromNewerVersion     Code = "store_from_newer_version"
	CodeEngineEnvReserved         Code = "engine_env_reserved"
	CodeEngineEnvNotApproved      Code = "engine_env_not_approved"
	CodeEngineOptionReserved      Code = "engine_option_reserved"
	CodeEngineOptionNotApproved   Code = "engine_option_not_approved"
	CodeEngineOptionOwned         Code = "engine_option_owned"
	CodeExtraArgsNotAccepted      Code = "extra_args_not_accepted"
	CodeRemoteCodeNotAllowed      Code = "remote_code_not_allowed"
	CodeUnknownConfigKey          Code = "unknown_config_key"
	CodeCheckpointMismatch        Code = "checkpoint_mismatch"
	CodeCheckpointUnusable        Code = "checkpoint_unusable"
	CodeHostNameChanged           Code = "host_name_changed"
	CodeStillStopping             Code = "still_stopping"
	CodeDeleteRequiresCleanup     Code = "delete_requires_cleanup"
	CodeToolchainMissing          Code = "toolchain_missing"
	CodeEngineNotFound            Code = "engine_not_found"
	CodeEngineUnsupported         Code = "engine_unsupported"
	CodeEngineVersionFailed       Code = "engine_version_failed"
	CodeEngineExists              Code = "engine_exists"
	CodeEngineInUse               Code = "engine_in_use"
	CodeInstallationDrift         Code = "installation_drift"
	CodeNotInteractive            Code = "not_interactive"
	CodeWakeMismatch              Code = "wake_mismatch"
	CodeWakeFailed                Code = "wake_failed"
	CodeParkFailed                Code = "park_failed"
	CodeDriverUnavailable         Code = "driver_unavailable"
	CodeDriverTimeout             Code = "driver_timeout"
	CodeDriverHandshakeFailed     Code = "driver_handshake_failed"
	CodeDriverProtocolUnsupported Code = "driver_protocol_unsupported"
	CodeDriverExitedAtStart       Code = "driver_exited_at_start"
	CodeDriverReplyMalformed      Code = "driver_reply_malformed"
	CodeMethodNotAllowed          Code = "method_not_allowed"
	CodeUnsupportedMediaType      Code = "unsupported_media_type"
	CodeCursorExpired             Code = "cursor_expired"
	CodeInvalidCursor             Code = "invalid_cursor"
	CodeRoleNotRunning            Code = "role_not_running"
	CodeCacheSaltUnsupported      Code = "cache_salt_unsupported"
	CodeDownloadFailed            Code = "download_failed"
	CodeDeadlineExceeded          Code = "deadline_exceeded"
	CodeStreamStalled             Code = "stream_stalled"
	CodeChunkTooLarge             Code = "chunk_too_large"
	CodeEngineNotIdle             Code = "engine_not_idle"
	CodeBodiesInFlightFull        Code = "bodies_in_flight_full"
	CodeBodyReadTimeout           Code = "body_read_timeout"
	CodeStoreUnavailable          Code = "store_unavailable"
	CodeCrossSiteRefused          Code = "cross_site_refused"
	CodeJoinTokenInvalid          Code = "join_token_invalid"
	CodeJoinTokenExpired          Code = "join_token_expired"
	CodeJoinTokenUsed             Code = "join_token_used"
	CodeJoinCAMismatch            Code = "join_ca_mismatch"
	CodeHostRevoked               Code = "host_revoked"
	CodeHostUnreachable           Code = "host_unreachable"
	CodeHostDraining              Code = "host_draining"
	CodeNotLeader                 Code = "not_leader"
	CodeSnapshotInvalid           Code = "snapshot_invalid"
	CodeSnapshotCAMismatch        Code = "snapshot_ca_mismatch"
	CodeCountTokensUnsupported    Code = "count_tokens_unsupported"
	CodeResponseNotFound          Code = "response_not_found"
	CodeAddressInUse              Code = "address_in_use"

	// Groups: one model across several machines.
	CodeGroupPlacementRequired    Code = "group_placement_required"
	CodeGroupTopologyInvalid      Code = "group_topology_invalid"
	CodeGroupShapeUnsupported     Code = "group_shape_unsupported"
	CodeGroupInstancesUnsupported Code = "group_instances_unsupported"
	CodeGroupMemberFailed         Code = "group_member_failed"
	CodeGroupMemberUncertain      Code = "group_member_uncertain"
	CodeGroupWakeMismatch         Code = "group_wake_mismatch"
	CodeGroupStalled              Code = "group_stalled"
	CodePeerAddressMissing        Code = "peer_address_missing"
	CodeRendezvousPortsExhausted  Code = "rendezvous_ports_exhausted"
	// The server cluster (core/fleet).
	CodeServerCommandUnknown Code = "server_command_unknown"
	CodeServerRemoved        Code = "server_removed"
	CodeHostUnknown          Code = "host_unknown"
	CodeStaleTerm            Code = "stale_term"
	CodeLeaderUnanswered     Code = "leader_unanswered"
	CodeHostLinkFlooded      Code = "host_link_flooded"

	// Named API keys: limits, budgets and their management.
	CodeRateLimited   Code = "rate_limited"
	CodeQuotaExceeded Code = "quota_exceeded"
	CodeAPIKeyExists  Code = "api_key_exists"
	// The codes drivers return (sdk/driver.go) that no other row names,
	// and a driver's failure without a code.
	CodeInstanceNotFound Code = "instance_not_found"
	CodeStopFailed       Code = "stop_failed"
	CodeInvalidManifest  Code = "invalid_manifest"
	CodeDriverError      Code = "driver_error"
)

var catalogue = map[Code]CodeInfo{}

func row(c Code, exit int, retryable bool, summary string) {
	catalogue[c] = CodeInfo{Code: c, Exit: exit, Retryable: retryable, Summary: summary}
}

func init() {
	row(CodeOK, 0, false, "success")
	row(CodeInvalidRequest, 2, false, "the request is malformed or a field is invalid")
	row(CodeInvalidConfig, 2, false, "a job spec or configuration does not parse or validate")
	row(CodeUnauthorized, 3, false, "missing or wrong API key or admin token")
	row(CodeNotFound, 2, false, "no such deployment, instance or resource")
	row(CodeUnknownModel, 2, false, "no deployment serves this model name")
	row(CodeAPIMismatch, 2, false, "the model serves the other inference API")
	row(CodeEngineRejected, 2, false, "the engine refused the request as invalid (its own message)")
	row(CodeUnsupportedParameter, 2, false, "a request field CapyCTL never forwards")
	row(CodeRequestTooLarge, 2, false, "the request body is over the buffered bound")
	row(CodeQueueFull, 4, true, "waiting limits reached; retry after Retry-After")
	row(CodeInsufficientResources, 4, true, "no memory to activate the model now; retry after Retry-After")
	row(CodeDeploymentStopped, 2, false, "an operator stopped the deployment")
	row(CodeDeploymentInactive, 2, false, "the deployment activates only on an operator's start")
	row(CodeConflict, 2, false, "the action conflicts with the deployment's current state")
	row(CodeRevisionConflict, 2, false, "the update names a revision that is no longer current")
	row(CodeIdempotencyConflict, 2, false, "the idempotency key was used with another body")
	row(CodeUnavailable, 13, true, "the model cannot serve now (switching, draining, no runtime)")
	row(CodeShuttingDown, 13, true, "the role is shutting down")
	row(CodeEngineError, 13, false, "the engine answered with an error (its own message); the model keeps serving")
	row(CodeActivationFailed, 13, false, "the model could not start")
	row(CodeActivationTimeout, 10, true, "the model did not become ready within the deadline")
	row(CodeInternal, 13, false, "an internal error")
	row(CodeLaunchFailed, 13, false, "the engine's launch failed (its last log lines attached)")
	row(CodeStartupTimeout, 13, false, "the engine did not become ready within its startup deadline")
	row(CodeOffLoopback, 13, false, "the engine listened on a non-loopback address and was stopped")
	row(CodePortConflict, 13, true, "another process listens on the leased engine port")
	row(CodeCapacityBlocked, 4, true, "the start does not fit in memory (host, domain, need, free, limit named)")
	row(CodeInsufficientDevice, 4, false, "the deployment's charge exceeds every domain's managed limit")
	row(CodeInsufficientMemory, 4, false, "the deployment's host memory charge exceeds the host's managed limit")
	row(CodeStartupNeedsEmptyHost, 4, true, "an unmeasured first start fits only on an empty host")
	row(CodeUnsupported, 5, false, "the action is not supported")
	row(CodeCapabilityMissing, 5, false, "the engine or driver lacks a capability the deployment needs")
	row(CodeHostBackedUnavailable, 5, false, "host_backed residency needs a discrete GPU")
	row(CodeLMCacheUnavailable, 5, false, "lmcache = \"required\" where the instance cannot run a private LMCache (the reason follows the colon: host_off, retention_zero, engine_version, not_installed, lmcache_version, residency_not_qualified, decisions, own_connector)")
	row(CodeStoreFromNewerVersion, 5, false, "the state store was written by a newer CapyCTL")
	row(CodeEngineEnvReserved, 2, false, "an environment name CapyCTL owns or reserves")
	row(CodeEngineEnvNotApproved, 2, false, "an environment name the host has not approved")
	row(CodeEngineOptionReserved, 2, false, "an engine option reserved in any spelling")
	row(CodeEngineOptionNotApproved, 2, false, "an engine option or path that needs a host approval")
	row(CodeEngineOptionOwned, 2, false, "an engine option CapyCTL renders itself")
	row(CodeExtraArgsNotAccepted, 2, false, "extra_args without accept_extra_args = true")
	row(CodeRemoteCodeNotAllowed, 2, false, "trust_remote_code without the host's --allow-remote-code")
	row(CodeUnknownConfigKey, 2, false, "an engine_config key the driver does not know")
	row(CodeCheckpointMismatch, 2, false, "the model directory's digest differs from the declared one")
	row(CodeCheckpointUnusable, 2, false, "the model directory cannot be read or measured")
	row(CodeHostNameChanged, 2, false, "the state was written under another hostname")
	row(CodeStillStopping, 25, true, "a previous stop is still in progress")
	row(CodeDeleteRequiresCleanup, 2, false, "stop the deployment before deleting it")
	row(CodeToolchainMissing, 26, false, "build tools the engine needs are not on its PATH")
	row(CodeEngineNotFound, 16, false, "no such engine, or its program is missing")
	row(CodeEngineUnsupported, 17, false, "the installation is not an engine CapyCTL can run")
	row(CodeEngineVersionFailed, 18, false, "the engine's version could not be read")
	row(CodeEngineExists, 19, false, "an engine with this name is registered")
	row(CodeEngineInUse, 20, false, "a deployment uses this engine")
	row(CodeInstallationDrift, 17, false, "the installation changed since it was registered and pinned")
	row(CodeNotInteractive, 23, false, "a confirmation is needed and there is no terminal; pass --yes")
	row(CodeWakeMismatch, 13, false, "the woken model answered the wake check differently; it was stopped")
	row(CodeWakeFailed, 13, false, "the wake failed; the model was stopped")
	row(CodeParkFailed, 13, false, "the park failed")
	row(CodeStoreUnavailable, 27, true, "the state directory or store refuses writes (a full disk, a read-only or immutable file): nothing was launched or changed, or a launched engine was stopped; free room or restore the file and retry")
	row(CodeDriverUnavailable, 13, true, "the engine's driver is not running")
	row(CodeDriverTimeout, 13, true, "the engine's driver did not answer within its deadline (drivers.*_timeout); a driver that stops answering is killed and relaunched")
	row(CodeDriverHandshakeFailed, 13, false, "the driver program did not complete the plugin handshake (it must call sdk/plugin.Serve and write nothing else to stdout)")
	row(CodeDriverProtocolUnsupported, 13, false, "the driver speaks a driver protocol this CapyCTL does not; rebuild it against a supported SDK or upgrade CapyCTL")
	row(CodeDriverExitedAtStart, 13, false, "the driver program exited at launch, before the plugin handshake (its stderr attached)")
	row(CodeDriverReplyMalformed, 13, false, "the driver answered a call with a reply the protocol does not allow (the driver and call named); a fault of the driver")
	row(CodeMethodNotAllowed, 2, false, "method not allowed")
	row(CodeUnsupportedMediaType, 2, false, "send application/json")
	row(CodeCursorExpired, 2, false, "the event cursor is older than the journal; take a new snapshot")
	row(CodeInvalidCursor, 2, false, "the event cursor does not parse")
	row(CodeRoleNotRunning, 22, true, "no running role was found through the state directory")
	row(CodeCacheSaltUnsupported, 2, false, "the engine does not take cache_salt")
	row(CodeDownloadFailed, 13, true, "a model download failed")
	row(CodeDeadlineExceeded, 13, true, "no output within the request deadline (queueing, waking and prefill included); cancelled on the engine")
	row(CodeStreamStalled, 13, true, "the engine sent nothing for the stream idle bound; cancelled on the engine")
	row(CodeChunkTooLarge, 13, false, "the engine sent one piece of an answer over limits.max_chunk_bytes; cancelled on the engine")
	row(CodeEngineNotIdle, 13, true, "the engine still has requests running or waiting; drain it first")
	row(CodeBodiesInFlightFull, 4, true, "the request bodies the role holds, all together, reached limits.max_body_bytes_in_flight; retry after Retry-After")
	row(CodeBodyReadTimeout, 2, true, "the request body did not arrive within listener.body_read_timeout; the connection is closed")
	row(CodeCrossSiteRefused, 3, false, "a call with the dashboard's session cookie came from another origin or without the session's CSRF token")
	row(CodeJoinTokenInvalid, 3, false, "the join token does not parse, or this server never issued it; create one with `capyctl create join-token`")
	row(CodeJoinTokenExpired, 3, false, "the join token is past its expiry; create a new one")
	row(CodeJoinTokenUsed, 3, false, "the join token was already redeemed (each token joins one host once); create a new one")
	row(CodeJoinCAMismatch, 3, false, "the server's CA is not the one the join token names: the host refused to talk to it")
	row(CodeHostUnreachable, 4, true, "the host that runs the instance is not connected to the server; retry after Retry-After (another replica is tried first)")
	row(CodeHostDraining, 4, false, "the host is draining: it takes no new placement (capyctl drain host --resume)")
	row(CodeHostRevoked, 3, false, "the host was removed from the server; its certificate is refused on every new connection")
	row(CodeNotLeader, 28, true, "this server is not the leader of the server cluster and cannot commit a change; details name the leader (leader_id, leader_address; empty while an election runs)")
	row(CodeSnapshotInvalid, 2, false, "the server state snapshot is not one this release reads, or its checksum does not match its content: the file was changed or cut short; nothing was restored")
	row(CodeSnapshotCAMismatch, 3, false, "the snapshot was saved on a cluster of another CA: its hosts' certificates are not trusted here (start the servers from the old cluster's pki directory, or restore with --force)")
	row(CodeCountTokensUnsupported, 2, false, "the model's engine has no route that counts a Messages request's tokens with its own tokenizer and chat template (CapyCTL never estimates); vLLM and llama-server builds with /v1/messages/count_tokens have one")
	row(CodeResponseNotFound, 2, false, "no stored response with this ID for this API key: never stored (store false), deleted, past the retention, or another key's")
	row(CodeAddressInUse, 29, true, "another process listens on the address a role was told to listen on (listen, management_listen, cluster_listen): a role that did not stop yet, or another program; it is retried (the systemd units restart on it), or choose another address (--listen, --management-listen, --cluster-listen)")
	row(CodeGroupPlacementRequired, 2, false, "a topology needs placement.hosts naming at least two hosts, one rank per host")
	row(CodeGroupTopologyInvalid, 2, false, "the topology does not divide over the group's machines (tensor_parallel × pipeline_parallel must divide by the number of hosts)")
	row(CodeGroupShapeUnsupported, 5, false, "the engine cannot run this group shape (the engine follows the colon: TensorFold runs tensor_parallel 2 on exactly two machines; llama.cpp and custom engines run no groups)")
	row(CodeGroupInstancesUnsupported, 5, false, "a group runs one instance: leave instances unset or 1")
	row(CodeGroupMemberFailed, 13, false, "a member of the group failed (its host and rank named); the whole group was stopped")
	row(CodeGroupMemberUncertain, 13, true, "a member's host agent is out of reach: the member's state is unknown and its charge is kept until the agent is back")
	row(CodeGroupWakeMismatch, 13, false, "the woken group answered the wake check differently; the group was stopped")
	row(CodeGroupStalled, 13, false, "the group's bring-up stalled past group_stall_timeout; the group was stopped")
	row(CodePeerAddressMissing, 2, false, "a group member's host has no peer address (set peer_address, --peer-address or CAPYCTL_PEER_ADDRESS on the host)")
	row(CodeRendezvousPortsExhausted, 4, true, "every port of the head host's rendezvous_ports range is taken")
	row(CodeServerCommandUnknown, 5, false, "the replicated log holds a command a newer CapyCTL wrote, which this server cannot apply (nor skip: its writer did not flag it ignorable); the server stopped instead of diverging: upgrade it")
	row(CodeHostUnknown, 3, true, "the host's certificate is the cluster's but the cluster's state does not name the host (a state restored from a snapshot after the host first reached it): the host keeps trying, and is taken once a restore or a join names it")
	row(CodeHostLinkFlooded, 4, true, "a host sent more over its link than a host may (messages or bytes a second, with bursts): the server closed the link, counted it (capyctl_host_messages_refused_total{reason=\"over_rate\"}) and takes the host's next link; an honest host never reaches the bound")
	row(CodeStaleTerm, 28, true, "a host refused a command or a desired state from a server that led an older raft term than one the host has seen: a deposed leader's late word changes nothing; the current leader's stands")
	row(CodeLeaderUnanswered, 28, true, "the leader this server relayed a change to did not answer within the relay's bound (the longest a change may take: group_stall_timeout plus a minute): the change may or may not have been made; retry with the same Idempotency-Key (a server that lost its leader refuses not_leader as soon as raft notices, and a retry reaches the new leader)")
	row(CodeServerRemoved, 3, false, "this server was removed from its cluster (capyctl remove server): move its state directory away and join it again with a new server join token")
	row(CodeRateLimited, 4, true, "the API key is over one of its limits (requests or tokens per minute, requests at once), or its client address failed authentication too often; retry after Retry-After (the x-ratelimit-* headers say which limit and when it resets)")
	row(CodeQuotaExceeded, 4, true, "the API key spent its monthly token budget; Retry-After is the start of the next month (UTC), or raise the budget (capyctl update api-key NAME --monthly-tokens N)")
	row(CodeAPIKeyExists, 2, false, "an API key with this name exists: pick another name, or revoke the old key first")
	row(CodeInstanceNotFound, 13, true, "the engine's driver does not know the instance (relaunched during a start, a park or a wake): that effect failed; the instance is stopped or started again")
	row(CodeStopFailed, 25, true, "the driver could not stop the engine; the instance keeps its memory and its stop is retried")
	row(CodeInvalidManifest, 2, false, "the custom engine's manifest is invalid (the field named)")
	row(CodeDriverError, 13, false, "the driver failed a call without a code (the driver's code or message attached); a fault of the driver")
}

// Known reports whether a code (suffix ignored) is in the catalogue.
func Known(c Code) bool {
	_, ok := catalogue[Code(strings.SplitN(string(c), ":", 2)[0])]
	return ok
}

// Lookup returns the catalogue row of a code (suffix ignored); unknown codes
// read as internal.
func Lookup(c Code) CodeInfo {
	base := Code(strings.SplitN(string(c), ":", 2)[0])
	if info, ok := catalogue[base]; ok {
		return info
	}
	info := catalogue[CodeInternal]
	info.Code = c
	return info
}

// Catalogue returns every row, sorted by exit code then code; the docs and
// `capyctl help exit-codes` print it.
func Catalogue() []CodeInfo {
	out := make([]CodeInfo, 0, len(catalogue))
	for _, info := range catalogue {
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Exit != out[j].Exit {
			return out[i].Exit < out[j].Exit
		}
		return out[i].Code < out[j].Code
	})
	return out
}

// Error is a product error: a catalogue code, a message for a person, and
// optional structured details (figures of a capacity refusal, digests of a
// checkpoint mismatch).
type Error struct {
	Code    Code           `json:"code"`
	Message string         `json:"message"`
	Details map[string]any `json:"details,omitempty"`
	// RetryAfter is the Retry-After header in seconds, 0 for none.
	RetryAfter int `json:"-"`
	// Cause is the wrapped error, if any.
	Cause error `json:"-"`
}

// Error implements error.
func (e *Error) Error() string {
	if e.Message == "" {
		return string(e.Code)
	}
	return e.Message
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Cause }

// Info returns the catalogue row of the error's code.
func (e *Error) Info() CodeInfo { return Lookup(e.Code) }

// WithDetail adds a detail and returns e.
func (e *Error) WithDetail(k string, v any) *Error {
	if e.Details == nil {
		e.Details = map[string]any{}
	}
	e.Details[k] = v
	return e
}

// Errf builds an *Error.
func Errf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Wrap builds an *Error around a cause.
func Wrap(code Code, err error, format string, args ...any) *Error {
	// A store that refuses writes stays store_unavailable however a caller
	// wraps the failure as internal: the operator's remedy (free room,
	// restore the file) is the same.
	if code == CodeInternal && HasCode(err, CodeStoreUnavailable) {
		code = CodeStoreUnavailable
	}
	msg := fmt.Sprintf(format, args...)
	if err != nil {
		msg = msg + ": " + err.Error()
	}
	return &Error{Code: code, Message: msg, Cause: err}
}

// AsError returns err as an *Error, classifying foreign errors as internal
// (or their context equivalents).
func AsError(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return &Error{Code: CodeActivationTimeout, Message: err.Error(), Cause: err}
	}
	return &Error{Code: CodeInternal, Message: err.Error(), Cause: err}
}

// CodeOf returns err's code, or "" for nil.
func CodeOf(err error) Code {
	if err == nil {
		return ""
	}
	return AsError(err).Code
}

// HasCode reports whether err carries code c (suffix ignored).
func HasCode(err error, c Code) bool {
	if err == nil {
		return false
	}
	got := string(AsError(err).Code)
	return got == string(c) || strings.HasPrefix(got, string(c)+":")
}
