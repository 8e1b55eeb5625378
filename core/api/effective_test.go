// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"errors"
	"testing"

	"github.com/capyctl/capyctl/core/structs"
)

func asError(err error, target **structs.Error) bool { return errors.As(err, target) }

func TestValidKey(t *testing.T) {
	long := make([]byte, maxIdempotencyKey+1)
	for i := range long {
		long[i] = 'a'
	}
	cases := []struct {
		key  string
		want bool
	}{
		{"01J9ZQ3Y5R8K", true},
		{"", false},
		{"has space", false},
		{"tab\tkey", false},
		{"é", false},
		{string(long), false},
		{string(long[:maxIdempotencyKey]), true},
	}
	for _, c := range cases {
		if got := validKey(c.key); got != c.want {
			t.Errorf("validKey(%q) = %v, want %v", c.key, got, c.want)
		}
	}
}
