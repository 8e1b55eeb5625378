// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// TestReceipts_RetryWhileTheFirstRuns: a retry with the same key that
// arrives while the first call is still carrying out its mutation waits for
// it and replays its answer; it never runs the mutation a second time. A
// retry with another key does not wait.
func TestReceipts_RetryWhileTheFirstRuns(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "capyctl.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	rc := &Receipts{Store: st}

	var runs atomic.Int32
	entered, release := make(chan struct{}, 4), make(chan struct{})
	do := func() (int, any, error) {
		n := runs.Add(1)
		entered <- struct{}{}
		<-release
		return http.StatusCreated, map[string]any{"run": n}, nil
	}
	call := func(key string) <-chan *httptest.ResponseRecorder {
		out := make(chan *httptest.ResponseRecorder, 1)
		go func() {
			r := httptest.NewRequest(http.MethodPost, "/management/v1/deployments", strings.NewReader(`{}`))
			r.Header.Set(wire.HeaderIdempotencyKey, key)
			w := httptest.NewRecorder()
			rc.Run(w, r, []byte(`{}`), do)
			out <- w
		}()
		return out
	}
	waiters := func(key string) int {
		rc.keys.mu.Lock()
		defer rc.keys.mu.Unlock()
		if l := rc.keys.locks[key]; l != nil {
			return l.refs
		}
		return 0
	}

	first := call("k1")
	<-entered
	retry := call("k1")
	poll.Until(t, 10*time.Second, "the retry to wait for the first call's key", func() bool { return waiters("k1") == 2 || runs.Load() > 1 })
	if n := runs.Load(); n != 1 {
		t.Fatalf("a retry with the same key ran the mutation while the first still ran it (%d runs)", n)
	}
	other := call("k2")
	select {
	case <-entered: // the other key's call runs while k1 is held
	case <-time.After(10 * time.Second):
		t.Fatal("a call with another key waited for k1")
	}
	close(release)
	w1, w2, w3 := <-first, <-retry, <-other
	if w1.Code != http.StatusCreated || w1.Header().Get(wire.HeaderReplayed) != "" {
		t.Fatalf("first: %d replayed %q %s", w1.Code, w1.Header().Get(wire.HeaderReplayed), w1.Body)
	}
	if w2.Code != w1.Code || w2.Header().Get(wire.HeaderReplayed) != "true" || w2.Body.String() != w1.Body.String() {
		t.Fatalf("retry: %d replayed %q %s; want the first answer %s replayed", w2.Code, w2.Header().Get(wire.HeaderReplayed), w2.Body, w1.Body)
	}
	if w3.Code != http.StatusCreated || w3.Header().Get(wire.HeaderReplayed) != "" {
		t.Fatalf("other key: %d replayed %q", w3.Code, w3.Header().Get(wire.HeaderReplayed))
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("the mutation ran %d times, want 2 (k1 once, k2 once)", n)
	}
	if n := waiters("k1") + waiters("k2"); n != 0 {
		t.Fatalf("%d key locks left", n)
	}
}
