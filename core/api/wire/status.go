// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package wire

import (
	"net/http"

	"github.com/capyctl/capyctl/core/structs"
)

// httpStatus is the HTTP status the APIs (management and inference) answer
// each catalogue code with. The codes, exit codes and retry flags live in
// core/structs' catalogue; the status is the API's. IMPORTANT: a public
// contract like the codes themselves: add rows, never change one.
var httpStatus = map[structs.Code]int{
	structs.CodeOK:                        http.StatusOK,
	structs.CodeInvalidRequest:            http.StatusBadRequest,
	structs.CodeInvalidConfig:             http.StatusBadRequest,
	structs.CodeUnauthorized:              http.StatusUnauthorized,
	structs.CodeNotFound:                  http.StatusNotFound,
	structs.CodeUnknownModel:              http.StatusNotFound,
	structs.CodeAPIMismatch:               http.StatusBadRequest,
	structs.CodeEngineRejected:            http.StatusBadRequest,
	structs.CodeUnsupportedParameter:      http.StatusBadRequest,
	structs.CodeRequestTooLarge:           http.StatusRequestEntityTooLarge,
	structs.CodeQueueFull:                 http.StatusTooManyRequests,
	structs.CodeInsufficientResources:     http.StatusTooManyRequests,
	structs.CodeDeploymentStopped:         http.StatusConflict,
	structs.CodeDeploymentInactive:        http.StatusConflict,
	structs.CodeConflict:                  http.StatusConflict,
	structs.CodeRevisionConflict:          http.StatusConflict,
	structs.CodeIdempotencyConflict:       http.StatusConflict,
	structs.CodeUnavailable:               http.StatusServiceUnavailable,
	structs.CodeShuttingDown:              http.StatusServiceUnavailable,
	structs.CodeEngineError:               http.StatusBadGateway,
	structs.CodeActivationFailed:          http.StatusInternalServerError,
	structs.CodeActivationTimeout:         http.StatusGatewayTimeout,
	structs.CodeInternal:                  http.StatusInternalServerError,
	structs.CodeLaunchFailed:              http.StatusInternalServerError,
	structs.CodeStartupTimeout:            http.StatusGatewayTimeout,
	structs.CodeOffLoopback:               http.StatusInternalServerError,
	structs.CodePortConflict:              http.StatusConflict,
	structs.CodeCapacityBlocked:           http.StatusConflict,
	structs.CodeInsufficientDevice:        http.StatusBadRequest,
	structs.CodeInsufficientMemory:        http.StatusBadRequest,
	structs.CodeStartupNeedsEmptyHost:     http.StatusConflict,
	structs.CodeUnsupported:               http.StatusNotImplemented,
	structs.CodeCapabilityMissing:         http.StatusBadRequest,
	structs.CodeLMCacheUnavailable:        http.StatusBadRequest,
	structs.CodeHostBackedUnavailable:     http.StatusBadRequest,
	structs.CodeStoreFromNewerVersion:     http.StatusInternalServerError,
	structs.CodeEngineEnvReserved:         http.StatusBadRequest,
	structs.CodeEngineEnvNotApproved:      http.StatusBadRequest,
	structs.CodeEngineOptionReserved:      http.StatusBadRequest,
	structs.CodeEngineOptionNotApproved:   http.StatusBadRequest,
	structs.CodeEngineOptionOwned:         http.StatusBadRequest,
	structs.CodeExtraArgsNotAccepted:      http.StatusBadRequest,
	structs.CodeRemoteCodeNotAllowed:      http.StatusBadRequest,
	structs.CodeUnknownConfigKey:          http.StatusBadRequest,
	structs.CodeCheckpointMismatch:        http.StatusConflict,
	structs.CodeCheckpointUnusable:        http.StatusBadRequest,
	structs.CodeHostNameChanged:           http.StatusInternalServerError,
	structs.CodeStillStopping:             http.StatusServiceUnavailable,
	structs.CodeDeleteRequiresCleanup:     http.StatusConflict,
	structs.CodeToolchainMissing:          http.StatusBadRequest,
	structs.CodeEngineNotFound:            http.StatusNotFound,
	structs.CodeEngineUnsupported:         http.StatusBadRequest,
	structs.CodeEngineVersionFailed:       http.StatusBadRequest,
	structs.CodeEngineExists:              http.StatusConflict,
	structs.CodeEngineInUse:               http.StatusConflict,
	structs.CodeInstallationDrift:         http.StatusConflict,
	structs.CodeNotInteractive:            http.StatusBadRequest,
	structs.CodeWakeMismatch:              http.StatusInternalServerError,
	structs.CodeWakeFailed:                http.StatusInternalServerError,
	structs.CodeParkFailed:                http.StatusInternalServerError,
	structs.CodeStoreUnavailable:          http.StatusServiceUnavailable,
	structs.CodeCrossSiteRefused:          http.StatusForbidden,
	structs.CodeJoinTokenInvalid:          http.StatusUnauthorized,
	structs.CodeJoinTokenExpired:          http.StatusUnauthorized,
	structs.CodeJoinTokenUsed:             http.StatusUnauthorized,
	structs.CodeJoinCAMismatch:            http.StatusBadGateway,
	structs.CodeHostRevoked:               http.StatusForbidden,
	structs.CodeHostUnreachable:           http.StatusServiceUnavailable,
	structs.CodeHostDraining:              http.StatusConflict,
	structs.CodeNotLeader:                 http.StatusServiceUnavailable,
	structs.CodeSnapshotInvalid:           http.StatusBadRequest,
	structs.CodeSnapshotCAMismatch:        http.StatusConflict,
	structs.CodeCountTokensUnsupported:    http.StatusBadRequest,
	structs.CodeResponseNotFound:          http.StatusNotFound,
	structs.CodeAddressInUse:              http.StatusServiceUnavailable,
	structs.CodeGroupPlacementRequired:    http.StatusBadRequest,
	structs.CodeGroupTopologyInvalid:      http.StatusBadRequest,
	structs.CodeGroupShapeUnsupported:     http.StatusBadRequest,
	structs.CodeGroupInstancesUnsupported: http.StatusBadRequest,
	structs.CodeGroupMemberFailed:         http.StatusInternalServerError,
	structs.CodeGroupMemberUncertain:      http.StatusServiceUnavailable,
	structs.CodeGroupWakeMismatch:         http.StatusInternalServerError,
	structs.CodeGroupStalled:              http.StatusInternalServerError,
	structs.CodePeerAddressMissing:        http.StatusBadRequest,
	structs.CodeRendezvousPortsExhausted:  http.StatusServiceUnavailable,
	structs.CodeInstanceNotFound:          http.StatusServiceUnavailable,
	structs.CodeStopFailed:                http.StatusServiceUnavailable,
	structs.CodeInvalidManifest:           http.StatusBadRequest,
	structs.CodeDriverError:               http.StatusBadGateway,
	structs.CodeDriverUnavailable:         http.StatusServiceUnavailable,
	structs.CodeDriverTimeout:             http.StatusGatewayTimeout,
	structs.CodeDriverHandshakeFailed:     http.StatusBadGateway,
	structs.CodeDriverProtocolUnsupported: http.StatusBadGateway,
	structs.CodeDriverExitedAtStart:       http.StatusBadGateway,
	structs.CodeDriverReplyMalformed:      http.StatusBadGateway,
	structs.CodeMethodNotAllowed:          http.StatusMethodNotAllowed,
	structs.CodeUnsupportedMediaType:      http.StatusUnsupportedMediaType,
	structs.CodeCursorExpired:             http.StatusGone,
	structs.CodeInvalidCursor:             http.StatusBadRequest,
	structs.CodeRoleNotRunning:            http.StatusServiceUnavailable,
	structs.CodeCacheSaltUnsupported:      http.StatusBadRequest,
	structs.CodeDownloadFailed:            http.StatusBadGateway,
	structs.CodeDeadlineExceeded:          http.StatusGatewayTimeout,
	structs.CodeStreamStalled:             http.StatusGatewayTimeout,
	structs.CodeChunkTooLarge:             http.StatusBadGateway,
	structs.CodeEngineNotIdle:             http.StatusConflict,
	structs.CodeBodiesInFlightFull:        http.StatusTooManyRequests,
	structs.CodeBodyReadTimeout:           http.StatusRequestTimeout,
	structs.CodeServerCommandUnknown:      http.StatusServiceUnavailable,
	structs.CodeServerRemoved:             http.StatusForbidden,
	structs.CodeHostUnknown:               http.StatusServiceUnavailable,
	structs.CodeStaleTerm:                 http.StatusServiceUnavailable,
	structs.CodeRateLimited:               http.StatusTooManyRequests,
	structs.CodeQuotaExceeded:             http.StatusTooManyRequests,
	structs.CodeAPIKeyExists:              http.StatusConflict,
	structs.CodeLeaderUnanswered:          http.StatusGatewayTimeout,
	structs.CodeHostLinkFlooded:           http.StatusTooManyRequests,
}

// HTTPStatus returns the HTTP status an API answers a code with (a suffix
// after a colon ignored); a code outside the catalogue answers as internal.
func HTTPStatus(c structs.Code) int {
	if s, ok := httpStatus[structs.Lookup(c).Code]; ok {
		return s
	}
	return httpStatus[structs.CodeInternal]
}

// CodeRow is one row of the catalogue as the API publishes it: the code,
// its HTTP status, the CLI's exit code, whether a client may retry, and
// a summary. Its JSON names are the Go names (`capyctl help exit-codes
// --json` has always printed them so).
type CodeRow struct {
	Code      structs.Code
	HTTP      int
	Exit      int
	Retryable bool
	Summary   string
}

// Catalogue returns every row with its HTTP status, in the order of
// structs.Catalogue (exit code, then code).
func Catalogue() []CodeRow {
	infos := structs.Catalogue()
	out := make([]CodeRow, 0, len(infos))
	for _, info := range infos {
		out = append(out, CodeRow{Code: info.Code, HTTP: HTTPStatus(info.Code), Exit: info.Exit, Retryable: info.Retryable, Summary: info.Summary})
	}
	return out
}
