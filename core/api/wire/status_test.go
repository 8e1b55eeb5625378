// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package wire

import (
	"net/http"
	"testing"

	"github.com/capyctl/capyctl/core/structs"
)

// TestHTTPStatus_EveryCode keeps the API's statuses and the catalogue in
// step: every code has a status, and no status names a code the catalogue
// lost.
func TestHTTPStatus_EveryCode(t *testing.T) {
	codes := map[structs.Code]bool{}
	for _, info := range structs.Catalogue() {
		codes[info.Code] = true
		if _, ok := httpStatus[info.Code]; !ok {
			t.Errorf("%s has no HTTP status in core/api/wire", info.Code)
		}
	}
	for c := range httpStatus {
		if !codes[c] {
			t.Errorf("%s has an HTTP status but no catalogue row", c)
		}
	}
}

func TestHTTPStatus(t *testing.T) {
	cases := []struct {
		name string
		code structs.Code
		want int
	}{
		{name: "ok", code: structs.CodeOK, want: http.StatusOK},
		{name: "a refusal", code: structs.CodeQueueFull, want: http.StatusTooManyRequests},
		{name: "a suffix is ignored", code: structs.CodeEngineEnvReserved + ":VLLM_API_KEY", want: http.StatusBadRequest},
		{name: "an unknown code reads as internal", code: "no_such_code", want: http.StatusInternalServerError},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := HTTPStatus(c.code); got != c.want {
				t.Fatalf("HTTPStatus(%s) = %d, want %d", c.code, got, c.want)
			}
		})
	}
}
