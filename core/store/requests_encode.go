// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// appendRecord appends r's JSON, byte for byte what json.Marshal writes,
// without its reflection: the writer encodes every request's record, and
// encoding/json took about 1.5 µs of a quiet processor for one (this takes
// a fifth of that). A string that needs escaping, a time or a number
// encoding/json treats specially goes through encoding/json.
//
// IMPORTANT: a field added to structs.RequestRecord must be added here;
// TestAppendRecord_IsJSONMarshal fails until it is.
func appendRecord(b []byte, r *structs.RequestRecord) ([]byte, error) {
	var err error
	b = append(b, `{"id":`...)
	b = appendString(b, r.ID)
	if r.ClientRequestID != "" {
		b = append(b, `,"client_request_id":`...)
		b = appendString(b, r.ClientRequestID)
	}
	b = append(b, `,"deployment":`...)
	b = appendString(b, r.Deployment)
	if r.Instance != "" {
		b = append(b, `,"instance":`...)
		b = appendString(b, r.Instance)
	}
	b = append(b, `,"api":`...)
	b = appendString(b, r.API)
	b = append(b, `,"stream":`...)
	b = strconv.AppendBool(b, r.Stream)
	b = append(b, `,"outcome":`...)
	b = appendString(b, r.Outcome)
	if r.Code != "" {
		b = append(b, `,"code":`...)
		b = appendString(b, r.Code)
	}
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(r.Status), 10)
	b = append(b, `,"received_at":`...)
	if b, err = appendTime(b, r.ReceivedAt); err != nil {
		return b, err
	}
	for _, f := range []struct {
		name string
		v    float64
		omit bool
	}{
		{`,"queue_ms":`, r.QueueMs, true}, {`,"activation_ms":`, r.ActivationMs, true},
		{`,"ttfb_ms":`, r.TTFBMs, true}, {`,"total_ms":`, r.TotalMs, false},
	} {
		if f.omit && f.v == 0 {
			continue
		}
		b = append(b, f.name...)
		if b, err = appendFloat(b, f.v); err != nil {
			return b, err
		}
	}
	b = append(b, `,"bytes_in":`...)
	b = strconv.AppendInt(b, r.BytesIn, 10)
	b = append(b, `,"bytes_out":`...)
	b = strconv.AppendInt(b, r.BytesOut, 10)
	if r.PromptTokens != 0 {
		b = append(b, `,"prompt_tokens":`...)
		b = strconv.AppendInt(b, r.PromptTokens, 10)
	}
	if r.CompletionToks != 0 {
		b = append(b, `,"completion_tokens":`...)
		b = strconv.AppendInt(b, r.CompletionToks, 10)
	}
	if r.Key != "" {
		b = append(b, `,"key":`...)
		b = appendString(b, r.Key)
	}
	return append(b, '}'), nil
}

// appendString appends s quoted as encoding/json quotes it.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// appendTime appends t as time.Time.MarshalJSON writes it, without its
// allocation: RFC 3339 with nanoseconds, quoted; a time it refuses (a year
// outside 0-9999, a zone offset of 24 hours or more) goes through it, for
// its error.
func appendTime(b []byte, t time.Time) ([]byte, error) {
	n0 := len(b)
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	num2 := func(b []byte) byte { return 10*(b[0]-'0') + (b[1] - '0') }
	ok := len(b) > n0+6 && b[n0+1+len("9999")] == '-'
	if ok && b[len(b)-1] != 'Z' {
		c := b[len(b)-len("Z07:00")]
		ok = !('0' <= c && c <= '9') && num2(b[len(b)-len("07:00"):]) < 24
	}
	if !ok {
		q, err := t.MarshalJSON()
		return append(b[:n0], q...), err
	}
	return append(b, '"'), nil
}

// appendFloat appends f as encoding/json writes a float64.
func appendFloat(b []byte, f float64) ([]byte, error) {
	abs := math.Abs(f)
	if math.IsNaN(f) || math.IsInf(f, 0) || (abs != 0 && (abs < 1e-6 || abs >= 1e21)) {
		q, err := json.Marshal(f)
		return append(b, q...), err
	}
	return strconv.AppendFloat(b, f, 'f', -1, 64), nil
}

// deploymentKey is how appendRecord (and json.Marshal) writes the
// deployment's key after the record's first field. Outside a string only:
// a quote inside a JSON string is escaped, so `,"` can only be structural.
var deploymentKey = []byte(`,"deployment":"`)

// recordDeployment returns a stored record's deployment without decoding
// the record (pruning a full ledger reads one per record folded; decoding
// the whole record cost about 1.5 µs). A value with an escape in it, or a
// record laid out otherwise, is decoded by encoding/json.
func recordDeployment(raw []byte) string {
	if i := bytes.Index(raw, deploymentKey); i >= 0 {
		v := raw[i+len(deploymentKey):]
		if end := bytes.IndexByte(v, '"'); end >= 0 && bytes.IndexByte(v[:end], '\\') < 0 {
			return string(v[:end])
		}
	}
	var head struct {
		Deployment string `json:"deployment"`
	}
	_ = json.Unmarshal(raw, &head)
	return head.Deployment
}
