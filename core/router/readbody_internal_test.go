// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestReadBody: a whole answer is read with or without a Content-Length
// (an engine may answer chunked), and never beyond the limit, whatever
// length the answer declares.
func TestReadBody(t *testing.T) {
	for _, tc := range []struct {
		name   string
		length int64
		body   string
		limit  int64
		want   string
	}{
		{"sized", 10, "0123456789", 16, "0123456789"},
		{"sized at the limit", 10, "0123456789", 10, "0123456789"},
		{"no length", -1, "0123456789", 16, "0123456789"},
		{"no length over the limit", -1, "0123456789", 4, "0123"},
		{"declared over the limit", 10, "0123456789", 4, "0123"},
	} {
		resp := &http.Response{ContentLength: tc.length, Body: io.NopCloser(strings.NewReader(tc.body))}
		got, err := readBody(resp, tc.limit)
		if err != nil || string(got) != tc.want {
			t.Errorf("%s: got %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
}
