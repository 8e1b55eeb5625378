// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"bytes"
	"encoding/json"
	"io"
	"strconv"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// engineStatusError answers an engine's error status: 400 engine_rejected
// for a refused request (the engine is done with it), 502 engine_error for
// a failure (the model keeps serving; the place settles on the engine's
// idle reading).
func (q *request) engineStatusError(call *engineCall) {
	resp := call.Resp
	msg, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	reusable := false
	if err == nil {
		var one [1]byte
		n, rerr := resp.Body.Read(one[:])
		reusable = n == 0 && rerr == io.EOF
	}
	call.finish(reusable)
	q.endAt = time.Now()
	text := engineMessage(msg, resp.StatusCode)
	switch resp.StatusCode {
	case 400, 413, 422:
		q.done()
		q.outcome = OutcomeEngineRejected
		q.fail(structs.Errf(structs.CodeEngineRejected, "%s", text).WithDetail("engine_status", resp.StatusCode))
	default:
		if q.place != nil {
			q.place.Failed()
			q.place = nil
		}
		q.outcome = OutcomeEngineError
		q.fail(structs.Errf(structs.CodeEngineError, "%s", text).WithDetail("engine_status", resp.StatusCode))
	}
}

// engineMessage extracts the engine's own error message.
func engineMessage(body []byte, status int) string {
	var env struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
		Detail  any             `json:"detail"`
	}
	if json.Unmarshal(body, &env) == nil {
		if len(env.Error) > 0 {
			var inner struct {
				Message string `json:"message"`
			}
			if json.Unmarshal(env.Error, &inner) == nil && inner.Message != "" {
				return inner.Message
			}
			var s string
			if json.Unmarshal(env.Error, &s) == nil && s != "" {
				return s
			}
		}
		if env.Message != "" {
			return env.Message
		}
		if s, ok := env.Detail.(string); ok && s != "" {
			return s
		}
	}
	if b := bytes.TrimSpace(body); len(b) > 0 {
		return string(b)
	}
	return "the engine answered HTTP " + strconv.Itoa(status)
}

// engineErrorCode reads the HTTP-like code of an in-stream engine error
// ({"error":{"code":400,...}}), 0 when it has none.
func engineErrorCode(payload []byte) int {
	var env struct {
		Error struct {
			Code any `json:"code"`
		} `json:"error"`
		Code any `json:"code"`
	}
	if json.Unmarshal(payload, &env) != nil {
		return 0
	}
	for _, c := range []any{env.Error.Code, env.Code} {
		switch v := c.(type) {
		case float64:
			return int(v)
		case string:
			if n, err := strconv.Atoi(v); err == nil {
				return n
			}
		}
	}
	return 0
}
