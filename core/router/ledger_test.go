// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
)

type ledger struct {
	mu   sync.Mutex
	recs []structs.RequestRecord
}

func (l *ledger) Record(r structs.RequestRecord) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r)
}

func (l *ledger) all() []structs.RequestRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]structs.RequestRecord(nil), l.recs...)
}

func TestRouter_LedgerRecordsEachRequestWithoutText(t *testing.T) {
	led := &ledger{}
	e := newEnv(t, envOpts{router: func(c *router.Config) { c.RequestLog = led }})
	const secret = "my secret prompt"
	body := `{"model":"demo","messages":[{"role":"user","content":"` + secret + `"}]}`
	resp, err := e.post(context.Background(), "/v1/chat/completions", body, map[string]string{"X-Request-Id": "client-secret-id"})
	if err != nil {
		t.Fatal(err)
	}
	answer := readBody(t, resp)
	id := resp.Header.Get(router.HeaderRequestID)
	resp, err = e.post(context.Background(), "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp)
	waitFor(t, "two records", func() bool { return len(led.all()) == 2 })
	recs := led.all()
	r := recs[0]
	if r.ID != id || r.Deployment != "demo" || r.Instance != "demo/0" || r.Outcome != "completed" || r.Status != 200 ||
		r.BytesIn != int64(len(body)) || r.BytesOut != int64(len(answer)) || r.PromptTokens == 0 || r.CompletionToks == 0 || r.TotalMs <= 0 {
		t.Fatalf("record %+v", r)
	}
	if recs[1].Outcome != "refused" || recs[1].Code != "unknown_model" || recs[1].Status != 404 {
		t.Fatalf("refusal record %+v", recs[1])
	}
	raw, _ := json.Marshal(recs)
	if strings.Contains(string(raw), secret) || strings.Contains(string(raw), "client-secret-id") {
		t.Fatalf("the ledger holds request text or the client's ID: %s", raw)
	}
}

// TestRouter_LedgerDropsAreCounted: when the request ledger's queue is full
// (its writer held behind the store's write lock), the records it loses are
// exported as capyctl_request_ledger_dropped_total.
func TestRouter_LedgerDropsAreCounted(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "capyctl.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	opts := store.DefaultRequestWriterOptions()
	opts.Buffer, opts.MaxBatch = 4, 1
	w := store.NewRequestWriter(st, opts)
	e := newEnv(t, envOpts{router: func(c *router.Config) { c.RequestLog = w }})
	if got := scrapeDropped(t, e.rt); got != 0 {
		t.Fatalf("dropped %v before any record", got)
	}
	// Hold the store's writer lock: the writer takes one record and waits
	// on its commit, the queue takes four, the rest are dropped.
	held, done := make(chan struct{}), make(chan struct{})
	go func() {
		_ = st.Update(func(*store.Tx) error {
			close(held)
			<-done
			return nil
		})
	}()
	<-held
	for i := 0; i < 20; i++ {
		w.Record(structs.RequestRecord{ID: fmt.Sprintf("r%d", i), Deployment: "demo", ReceivedAt: time.Now()})
	}
	dropped := w.Dropped()
	if dropped < 20-1-4 {
		t.Fatalf("the writer dropped %d of 20 records with room for 5", dropped)
	}
	if got := scrapeDropped(t, e.rt); got != float64(dropped) {
		t.Fatalf("capyctl_request_ledger_dropped_total = %v, the writer counted %d", got, dropped)
	}
	close(done)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// scrapeDropped reads capyctl_request_ledger_dropped_total from the
// router's metrics (-1 when absent).
func scrapeDropped(t *testing.T, rt *router.Router) float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	rt.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if v, ok := strings.CutPrefix(line, "capyctl_request_ledger_dropped_total "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	return -1
}
