// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import "testing"

// TestEngineErrorCode: the HTTP-like code of an in-stream engine error is
// read from error.code or code, a number or a numeric string; none, or a
// payload that does not decode, is 0.
func TestEngineErrorCode(t *testing.T) {
	cases := []struct {
		payload string
		want    int
	}{
		{`{"error":{"code":400,"message":"bad"}}`, 400},
		{`{"code":"429"}`, 429},
		{`{"error":{"code":"x"},"code":500}`, 500},
		{`{"error":{"message":"no code"}}`, 0},
		{`not json {"code":400}`, 0},
	}
	for _, c := range cases {
		if got := engineErrorCode([]byte(c.payload)); got != c.want {
			t.Errorf("engineErrorCode(%s) = %d, want %d", c.payload, got, c.want)
		}
	}
}
