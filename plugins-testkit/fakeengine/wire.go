// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
)

// SSEDone is the OpenAI stream terminator.
var SSEDone = []byte("data: [DONE]\n\n")

// SSEData renders v as one server-sent event: "data: <json>\n\n".
func SSEData(v any) []byte {
	var buf bytes.Buffer
	buf.WriteString("data: ")
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.Encode(v) // ends with '\n'
	buf.WriteByte('\n')
	return buf.Bytes()
}

// Metric is one Prometheus sample with its family's help and type.
type Metric struct {
	// Name is the family name ("vllm:num_requests_running").
	Name string
	// Type is "gauge", "counter", …
	Type string
	// Help is the family's help text.
	Help string
	// Labels are the sample's labels, in the order written.
	Labels []Label
	// Value is the sample value.
	Value float64
}

// Label is one Prometheus label.
type Label struct {
	// Name is the label name.
	Name string
	// Value is the label value.
	Value string
}

// PrometheusContentType is the text exposition format's content type.
const PrometheusContentType = "text/plain; version=0.0.4; charset=utf-8"

// WritePrometheus writes metrics in the text exposition format, with the
// HELP and TYPE lines once per family (consecutive samples of one name
// share them).
func WritePrometheus(w io.Writer, metrics []Metric) error {
	var buf bytes.Buffer
	prev := ""
	for _, m := range metrics {
		if m.Name != prev {
			buf.WriteString("# HELP " + m.Name + " " + m.Help + "\n")
			buf.WriteString("# TYPE " + m.Name + " " + m.Type + "\n")
			prev = m.Name
		}
		buf.WriteString(m.Name)
		if len(m.Labels) > 0 {
			buf.WriteByte('{')
			for i, l := range m.Labels {
				if i > 0 {
					buf.WriteByte(',')
				}
				buf.WriteString(l.Name + "=" + strconv.Quote(l.Value))
			}
			buf.WriteByte('}')
		}
		buf.WriteString(" " + formatValue(m.Value) + "\n")
	}
	_, err := w.Write(buf.Bytes())
	return err
}

// BearerToken is the token of an "Authorization: Bearer <token>" header,
// or "".
func BearerToken(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > len("Bearer ") && strings.EqualFold(h[:len("Bearer ")], "Bearer ") {
		return h[len("Bearer "):]
	}
	return ""
}

// KeyMatches compares a presented key with the configured one in constant
// time (over SHA-256 digests, so the length does not leak either).
func KeyMatches(presented, key string) bool {
	a := sha256.Sum256([]byte(presented))
	b := sha256.Sum256([]byte(key))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1 && presented != ""
}

// APIKeyMiddleware guards routes with an API key. A request passes when key
// is empty, when public(r) is true, or when one of creds(r) matches key;
// others get deny. creds nil means the bearer token only.
func APIKeyMiddleware(key string, public func(*http.Request) bool, creds func(*http.Request) []string, deny http.HandlerFunc) func(http.Handler) http.Handler {
	if creds == nil {
		creds = func(r *http.Request) []string { return []string{BearerToken(r)} }
	}
	return func(next http.Handler) http.Handler {
		if key == "" {
			return next
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if public != nil && public(r) {
				next.ServeHTTP(w, r)
				return
			}
			for _, c := range creds(r) {
				if KeyMatches(c, key) {
					next.ServeHTTP(w, r)
					return
				}
			}
			deny(w, r)
		})
	}
}

// formatValue writes integers without an exponent, other values shortest.
func formatValue(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e15 {
		return strconv.FormatInt(int64(v), 10)
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
