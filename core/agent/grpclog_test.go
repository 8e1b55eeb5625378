// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// TestGRPCLogger: gRPC's own log lines land in the role's logger as JSON
// objects, warnings and errors at their level and info at debug.
func TestGRPCLogger(t *testing.T) {
	var buf bytes.Buffer
	l := grpcLogger{hclog.New(&hclog.LoggerOptions{Output: &buf, JSONFormat: true, Level: hclog.Debug})}
	l.Warningf("transport: %s", "connection reset")
	l.Errorln("lost", "it")
	l.Info("chatty")
	if l.V(2) {
		t.Error("gRPC's verbose lines are logged")
	}
	var levels []string
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("not a JSON line: %q", line)
		}
		levels = append(levels, m["@level"].(string)+":"+m["@message"].(string))
	}
	want := []string{"warn:transport: connection reset", "error:lost it", "debug:chatty"}
	if strings.Join(levels, "|") != strings.Join(want, "|") {
		t.Fatalf("logged %q, want %q", levels, want)
	}
}
