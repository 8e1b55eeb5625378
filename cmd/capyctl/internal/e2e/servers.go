// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// CaughtUp reports whether r is back in the cluster of want voters: a
// leader known, r a follower or the leader, its state applied as far as
// the leader's, nothing degraded.
func CaughtUp(r *harness.Role, want int) bool {
	list, err := r.Servers()
	if err != nil || list.Leader == "" || list.Voters != want || list.Degraded {
		return false
	}
	var self, lead wire.ServerInfo
	for _, s := range list.Servers {
		if s.Name == list.Self {
			self = s
		}
		if s.Name == list.Leader {
			lead = s
		}
	}
	return (self.State == "follower" || self.State == "leader") && self.AppliedIndex > 0 && self.AppliedIndex >= lead.AppliedIndex
}

// HostNames is `list hosts --json` on r, by name.
func HostNames(t *testing.T, r *harness.Role) []string {
	t.Helper()
	out, errOut, code := r.CLI("list", "hosts", "--json")
	if code != 0 {
		t.Fatalf("list hosts: exit %d: %s", code, errOut)
	}
	var hosts []wire.Host
	if err := json.Unmarshal([]byte(out), &hosts); err != nil {
		t.Fatalf("list hosts --json: %v\n%s", err, out)
	}
	var names []string
	for _, h := range hosts {
		names = append(names, h.Name)
	}
	return names
}

// DeploymentNames is `list deployments --json` on a server, by name;
// false when the command fails.
func DeploymentNames(t *testing.T, r *harness.Role) ([]string, bool) {
	t.Helper()
	out, _, code := r.CLI("list", "deployments", "--json")
	if code != 0 {
		return nil, false
	}
	var list wire.DeploymentList
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("list deployments --json: %v\n%s", err, out)
	}
	var names []string
	for _, d := range list.Deployments {
		names = append(names, d.Name)
	}
	return names, true
}

// LeaderOf returns the leader a server reports, "" during an election or
// when it does not answer.
func LeaderOf(r *harness.Role) string {
	list, err := r.Servers()
	if err != nil {
		return ""
	}
	return list.Leader
}

// ChatAnswers sends one chat request through r and reports whether it
// was answered with a completion.
func ChatAnswers(r *harness.Role, model string) bool {
	resp, err := r.Chat(context.Background(), harness.ChatBody(model, false, "hi"), nil)
	if err != nil {
		return false
	}
	body := harness.ReadAll(resp)
	return resp.StatusCode == http.StatusOK && strings.Contains(body, "choices")
}
