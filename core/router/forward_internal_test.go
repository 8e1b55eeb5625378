// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"strings"
	"testing"
)

// TestAppendMember: the first member after the brace takes no comma.
func TestAppendMember(t *testing.T) {
	if got := string(appendMember([]byte("{"), "model")); got != `{"model":` {
		t.Fatalf("first member %q", got)
	}
	if got := string(appendMember([]byte(`{"a":1`), "model")); got != `{"a":1,"model":` {
		t.Fatalf("next member %q", got)
	}
}

// TestTakeSalt_LongestAccepted: a cache_salt of maxCacheSalt bytes is taken.
func TestTakeSalt_LongestAccepted(t *testing.T) {
	var q request
	s := strings.Repeat("s", maxCacheSalt)
	if !q.takeSalt(&s) {
		t.Fatal("a salt of the maximum length was refused")
	}
}
