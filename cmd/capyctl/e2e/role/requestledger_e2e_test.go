// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package role_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capyctl/capyctl/cmd/capyctl/internal/e2e"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// listRequests is GET /management/v1/requests?limit=500: the IDs of the
// newest records, newest first.
func listRequests(t *testing.T, r *harness.Role) []string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+r.Info.Management+"/management/v1/requests?limit=500", nil)
	req.Header.Set("Authorization", "Bearer "+r.Creds.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("list requests: %v", err)
	}
	body := harness.ReadAll(resp)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("list requests: %d %s", resp.StatusCode, body)
	}
	var out struct {
		Requests []struct {
			ID string `json:"id"`
		} `json:"requests"`
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		t.Fatalf("list requests: %v\n%s", err, body)
	}
	ids := make([]string, len(out.Requests))
	for i, rec := range out.Requests {
		ids[i] = rec.ID
	}
	return ids
}

// TestRequestLedger_Kill9KeepsWhatWasListed: a role killed with SIGKILL in
// the middle of a load keeps, after its restart, every request record it
// listed before the kill, each once. A record is listed once it is on disk
// (the ledger's journal, folded into the store every few seconds, and by
// the next role after a crash); a record only queued when the kill came is
// lost, as documented, and was never listed.
func TestRequestLedger_Kill9KeepsWhatWasListed(t *testing.T) {
	r := e2e.StartWithDemo(t)
	url, key := r.InferenceURL()+"/v1/chat/completions", r.Creds.APIKey
	body := harness.ChatBody("demo", false, "hello")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer "+key)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return // the role is gone
				}
				harness.ReadAll(resp)
			}
		}()
	}
	var listed []string
	harness.Eventually(t, 60*time.Second, "the ledger to list 200 records", func() bool {
		listed = listRequests(t, r)
		return len(listed) >= 200
	})
	r.Kill9()
	cancel()
	wg.Wait()
	r.Restart()

	after := listRequests(t, r)
	seen := map[string]int{}
	for _, id := range after {
		seen[id]++
	}
	var lost []string
	for _, id := range listed {
		if seen[id] == 0 {
			lost = append(lost, id)
		}
	}
	if len(lost) > 0 {
		t.Fatalf("%d of the %d records listed before the kill are gone after the restart (%d listed now), e.g. %v\n%s",
			len(lost), len(listed), len(after), lost[:min(3, len(lost))], r.Output())
	}
	for id, n := range seen {
		if n > 1 {
			t.Fatalf("record %s is listed %d times after the restart", id, n)
		}
	}
	if len(after) < len(listed) {
		t.Fatalf("%d records after the restart, %d before", len(after), len(listed))
	}
}
