// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package structs

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func TestRedactValue(t *testing.T) {
	r := Redacted
	cases := []struct{ name, value, want string }{
		{"HF_TOKEN", "abc", r},
		{"FAKE_ENGINE_API_KEY", "abc", r},
		{"OPENAI_API_KEY", "abc", r},
		{"db_password", "abc", r},
		{"max_tokens", "8", "8"},
		{"TOKENIZERS_PARALLELISM", "false", "false"},
		{"CUDA_VISIBLE_DEVICES", "0", "0"},
		{"MIRROR", "https://user:pass@example.com/x", r},
		{"NOTE", "hf_abcdefghijklmnop", r},
		{"NOTE", "capyk_0123456789ab_ZGVtby1rZXktbm90LWEtcmVhbC1zZWNyZXQtYXQtYWxs", r},
		{"HF_TOKEN", "", ""},
	}
	for _, c := range cases {
		t.Run(c.name+"="+c.value, func(t *testing.T) {
			if got := RedactValue(c.name, c.value); got != c.want {
				t.Fatalf("RedactValue(%q, %q) = %q, want %q", c.name, c.value, got, c.want)
			}
		})
	}
}

func TestRedactArgv(t *testing.T) {
	r := Redacted
	cases := []struct {
		name string
		in   []string
		want []string
	}{
		{"separate value", []string{"serve", "--api-key", "s3cret", "--port", "8100"}, []string{"serve", "--api-key", r, "--port", "8100"}},
		{"joined value", []string{"--hf-token=abc", "--max-tokens=8"}, []string{"--hf-token=" + r, "--max-tokens=8"}},
		{"token-looking word", []string{"--note", "hf_abcdefghijklmnop"}, []string{"--note", r}},
		{"flag after a key flag", []string{"--api-key", "--verbose"}, []string{"--api-key", "--verbose"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := RedactArgv(c.in); !reflect.DeepEqual(got, c.want) {
				t.Fatalf("RedactArgv(%q) = %q, want %q", c.in, got, c.want)
			}
		})
	}
}

// TestDeployment_Redacted: every secret a spec can hold is redacted in the
// copy and kept in the original, which the launch needs.
func TestDeployment_Redacted(t *testing.T) {
	d := Deployment{Name: "a", EngineConfig: EngineConfig{
		Env:       map[string]string{"HF_TOKEN": "hf_secretsecret", "MIRROR": "https://u:p@example.com", "LOG_LEVEL": "info"},
		ExtraArgs: []string{"--api-key", "s3cret", "--port", "1"},
		Family: map[string]json.RawMessage{
			"vllm":   json.RawMessage(`{"auth_token":"s3cret","hf":{"password":42},"args":["--hf-token=s3cret","x"],"note":"Bearer s3cret","n":3}`),
			"sglang": json.RawMessage(`not json s3cret`),
		},
	}}
	r := d.Redacted()
	out, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "s3cret") || strings.Contains(string(out), "secretsecret") || strings.Contains(string(out), "u:p@") {
		t.Fatalf("a secret survives: %s", out)
	}
	if r.EngineConfig.Env["LOG_LEVEL"] != "info" || r.EngineConfig.ExtraArgs[3] != "1" || !strings.Contains(string(r.EngineConfig.Family["vllm"]), `"n":3`) {
		t.Fatalf("too much redacted: %s", out)
	}
	if d.EngineConfig.Env["HF_TOKEN"] != "hf_secretsecret" || d.EngineConfig.ExtraArgs[1] != "s3cret" || !strings.Contains(string(d.EngineConfig.Family["vllm"]), "s3cret") {
		t.Fatal("the original was changed")
	}
}
