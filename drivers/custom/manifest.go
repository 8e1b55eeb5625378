// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package custom

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/hclbound"
)

// Manifest describes a custom engine: how to start it and what it serves.
// The program itself is named at `capyctl engine add --custom <program>`.
//
//	args        = ["serve", "--host", "{{host}}", "--port", "{{port}}", "--name", "{{served_name}}"]
//	api         = "chat"               # chat | decisions
//	env         = { LOG_LEVEL = "info" }
//	health_path = "/health"            # optional
//	key_env     = "MY_SERVER_API_KEY"  # optional: receives the per-launch key
//	non_streamed_hangup = "stops"      # optional: stream (default) | stops
//	idle {                              # optional idle signal
//	  metrics_path = "/metrics"
//	  running      = "my_server:requests_running"
//	  waiting      = "my_server:requests_waiting"
//	}
//
// Placeholders in args and env values: {{host}}, {{port}}, {{served_name}},
// {{model_dir}}, {{launch_dir}}; env values may also use {{engine_key}}
// (never args: a secret never goes on a command line).
type Manifest struct {
	Args           []string          `hcl:"args,optional" json:"args"`
	API            string            `hcl:"api,optional" json:"api"`
	Env            map[string]string `hcl:"env,optional" json:"env,omitempty"`
	HealthPath     string            `hcl:"health_path,optional" json:"health_path,omitempty"`
	KeyEnv         string            `hcl:"key_env,optional" json:"key_env,omitempty"`
	ChatPath       string            `hcl:"chat_path,optional" json:"chat_path,omitempty"`
	DecisionsPath  string            `hcl:"decisions_path,optional" json:"decisions_path,omitempty"`
	ModelsPath     string            `hcl:"models_path,optional" json:"models_path,omitempty"`
	Version        string            `hcl:"version,optional" json:"version,omitempty"`
	StartupTimeout string            `hcl:"startup_timeout,optional" json:"startup_timeout,omitempty"`
	StopGrace      string            `hcl:"stop_grace,optional" json:"stop_grace,omitempty"`
	// NonStreamedHangup says whether the program stops a non-streamed
	// request when its connection closes ("stops") or notices a hang-up
	// only while it streams ("stream", the default): see
	// pb.NonStreamedHangup.
	NonStreamedHangup string      `hcl:"non_streamed_hangup,optional" json:"non_streamed_hangup,omitempty"`
	Idle              *IdleSignal `hcl:"idle,block" json:"idle,omitempty"`
}

// IdleSignal names the Prometheus gauges of running and waiting requests.
type IdleSignal struct {
	MetricsPath string `hcl:"metrics_path,optional" json:"metrics_path,omitempty"`
	Running     string `hcl:"running" json:"running"`
	Waiting     string `hcl:"waiting,optional" json:"waiting,omitempty"`
}

// placeholders allowed in args.
var argPlaceholders = []string{"{{host}}", "{{port}}", "{{served_name}}", "{{model_dir}}", "{{launch_dir}}"}

// ParseManifest parses and validates a manifest. Errors carry the file's
// line and column.
func ParseManifest(src []byte, filename string) (*Manifest, error) {
	if filename == "" {
		filename = "manifest.hcl"
	}
	// IMPORTANT: bound the source before the parser descends into it (a
	// 1 MB nested manifest once crashed this driver).
	if diags := hclbound.Check(src, filename); diags.HasErrors() {
		return nil, manifestErr(diags)
	}
	f, diags := hclsyntax.ParseConfig(src, filename, hcl.Pos{Line: 1, Column: 1})
	if diags.HasErrors() {
		return nil, manifestErr(diags)
	}
	var m Manifest
	if diags := gohcl.DecodeBody(f.Body, nil, &m); diags.HasErrors() {
		return nil, manifestErr(diags)
	}
	if err := m.validate(filename); err != nil {
		return nil, err
	}
	return &m, nil
}

func manifestErr(diags hcl.Diagnostics) error {
	d := diags[0]
	pos := ""
	if d.Subject != nil {
		pos = fmt.Sprintf("%s:%d:%d: ", d.Subject.Filename, d.Subject.Start.Line, d.Subject.Start.Column)
	}
	msg := d.Summary
	if d.Detail != "" {
		msg += ": " + d.Detail
	}
	return sdk.Errorf("invalid_config", "%s%s", pos, msg)
}

func (m *Manifest) validate(file string) error {
	if m.API == "" {
		m.API = "chat"
	}
	if m.API != "chat" && m.API != "decisions" {
		return sdk.Errorf("invalid_config", "%s: api must be \"chat\" or \"decisions\", not %q", file, m.API)
	}
	if len(m.Args) == 0 {
		return sdk.Errorf("invalid_config", "%s: args must start the server; include {{port}} where the port goes", file)
	}
	hasPort := false
	for _, a := range m.Args {
		if strings.Contains(a, "{{engine_key}}") {
			return sdk.Errorf("invalid_config", "%s: {{engine_key}} may not appear in args (a secret never goes on a command line); pass it through env with key_env", file)
		}
		if strings.Contains(a, "{{port}}") {
			hasPort = true
		}
		if err := checkPlaceholders(a, argPlaceholders); err != nil {
			return sdk.Errorf("invalid_config", "%s: args: %v", file, err)
		}
	}
	if !hasPort {
		return sdk.Errorf("invalid_config", "%s: args must contain {{port}}: CapyCTL leases the engine's loopback port", file)
	}
	for k, v := range m.Env {
		if err := checkPlaceholders(v, append(append([]string{}, argPlaceholders...), "{{engine_key}}")); err != nil {
			return sdk.Errorf("invalid_config", "%s: env %s: %v", file, k, err)
		}
	}
	for _, p := range []struct{ name, v string }{{"health_path", m.HealthPath}, {"chat_path", m.ChatPath}, {"decisions_path", m.DecisionsPath}, {"models_path", m.ModelsPath}} {
		if p.v != "" && !strings.HasPrefix(p.v, "/") {
			return sdk.Errorf("invalid_config", "%s: %s must start with /", file, p.name)
		}
	}
	for _, d := range []struct{ name, v string }{{"startup_timeout", m.StartupTimeout}, {"stop_grace", m.StopGrace}} {
		if d.v == "" {
			continue
		}
		if v, err := time.ParseDuration(d.v); err != nil || v <= 0 {
			return sdk.Errorf("invalid_config", "%s: %s %q is not a positive duration", file, d.name, d.v)
		}
	}
	switch m.NonStreamedHangup {
	case "", "stream", "stops":
	default:
		return sdk.Errorf("invalid_config", "%s: non_streamed_hangup must be \"stream\" or \"stops\", not %q", file, m.NonStreamedHangup)
	}
	if m.Idle != nil {
		if m.Idle.Running == "" {
			return sdk.Errorf("invalid_config", "%s: idle needs running (a gauge name)", file)
		}
		if m.Idle.MetricsPath == "" {
			m.Idle.MetricsPath = "/metrics"
		}
	}
	if m.ChatPath == "" {
		m.ChatPath = "/v1/chat/completions"
	}
	if m.DecisionsPath == "" {
		m.DecisionsPath = "/v1/systemone"
	}
	if m.ModelsPath == "" {
		m.ModelsPath = "/v1/models"
	}
	return nil
}

func checkPlaceholders(s string, allowed []string) error {
	rest := s
	for {
		i := strings.Index(rest, "{{")
		if i < 0 {
			return nil
		}
		j := strings.Index(rest[i:], "}}")
		if j < 0 {
			return fmt.Errorf("unclosed placeholder in %q", s)
		}
		ph := rest[i : i+j+2]
		ok := false
		for _, a := range allowed {
			if a == ph {
				ok = true
			}
		}
		if !ok {
			return fmt.Errorf("unknown placeholder %s (allowed: %s)", ph, strings.Join(allowed, ", "))
		}
		rest = rest[i+j+2:]
	}
}

// manifestFromDetails reads the manifest recorded with an installation.
func manifestFromDetails(details map[string]string) (*Manifest, error) {
	raw := details[detailManifest]
	if raw == "" {
		return nil, sdk.Errorf("invalid_config", "the installation has no recorded manifest; register it again with capyctl engine add --custom")
	}
	var m Manifest
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		return nil, sdk.Errorf("invalid_config", "recorded manifest: %v", err)
	}
	if err := m.validate("recorded manifest"); err != nil {
		return nil, err
	}
	return &m, nil
}

func (m *Manifest) startupTimeout() time.Duration {
	if d, err := time.ParseDuration(m.StartupTimeout); err == nil && d > 0 {
		return d
	}
	return 10 * time.Minute
}

func (m *Manifest) stopGrace(def time.Duration) time.Duration {
	if d, err := time.ParseDuration(m.StopGrace); err == nil && d > 0 {
		return d
	}
	return def
}
