// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// final reports whether a failed start cannot change on a retry (a refusal
// of the launch itself), so it gives up after one attempt.
func final(err error) bool {
	code := structs.CodeOf(err)
	for _, c := range []structs.Code{
		structs.CodeCapabilityMissing, structs.CodeCheckpointMismatch, structs.CodeCheckpointUnusable,
		structs.CodeEngineNotFound, structs.CodeInstallationDrift, structs.CodeEngineOptionReserved,
		structs.CodeEngineOptionNotApproved, structs.CodeEngineEnvReserved, structs.CodeEngineEnvNotApproved,
		structs.CodeInvalidConfig, structs.CodeCapacityBlocked, structs.CodeInsufficientDevice,
		structs.CodeRemoteCodeNotAllowed, structs.CodeUnknownConfigKey, structs.CodeNotFound,
		structs.CodeShuttingDown, structs.CodeConflict, structs.CodeStillStopping,
	} {
		if structs.HasCode(err, c) || code == c {
			return true
		}
	}
	return false
}

// retryStart retries a failed start of a deployment an operator wants
// running, with a cooldown that doubles each attempt, within the retry
// budget; then the instance stays failed until a new revision or an
// operator start.
func (m *Manager) retryStart(in *instance, err error, attempt int) {
	dr, ok := m.spec(in.dep)
	if !ok || dr.Desired != structs.DesiredRunning || final(err) || dr.Spec.Group != nil {
		return // a group member is restarted with its group, by the server
	}
	in.update(func(r *structs.InstanceRecord) { r.Attempts = attempt })
	if attempt >= m.cfg.RetryBudget {
		m.event("start_gave_up", in.dep, in.id, map[string]any{"attempts": attempt, "code": string(structs.CodeOf(err))})
		return
	}
	cooldown := m.cfg.RetryCooldown << (attempt - 1)
	m.event("start_retry_scheduled", in.dep, in.id, map[string]any{"attempt": attempt + 1, "cooldown_ms": cooldown.Milliseconds()})
	m.goTracked(func() {
		select {
		case <-time.After(cooldown):
		case <-m.ctx.Done():
			return
		}
		dr, ok := m.spec(in.dep)
		if !ok || dr.Desired != structs.DesiredRunning {
			return
		}
		if s := in.state(); s != structs.StateFailed && s != structs.StateStopped {
			return
		}
		if err := in.do(m.ctx, cmdStart, "retry after a failed start"); err != nil {
			m.retryStart(in, err, attempt+1)
		}
	})
}
