// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package poll

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestUntil_ReturnsOnceTheConditionHolds(t *testing.T) {
	var calls atomic.Int32
	Until(t, 10*time.Second, "the third call", func() bool { return calls.Add(1) == 3 })
	if n := calls.Load(); n != 3 {
		t.Fatalf("cond called %d times, want 3", n)
	}
}

// recorder is a testing.TB that records a failure instead of ending the
// test (so Until goes on polling: the condition below ends it).
type recorder struct {
	testing.TB
	msg string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) { r.msg = fmt.Sprintf(format, args...) }

func TestUntil_FailsNamingWhatItWaitedFor(t *testing.T) {
	r := &recorder{TB: t}
	Until(r, time.Millisecond, "the moon", func() bool { return r.msg != "" })
	if !strings.Contains(r.msg, "the moon") {
		t.Fatalf("failure %q does not name what it waited for", r.msg)
	}
}
