// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/capyctl/capyctl/core/router"
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
	e := newEnv(t, envOpts{router: func(c *router.Config) { c.Ledger = led }})
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
