// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"errors"
	"reflect"
	"testing"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
)

func asError(err error, target **structs.Error) bool { return errors.As(err, target) }

func TestRedactValue(t *testing.T) {
	r := wire.Redacted
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
	r := wire.Redacted
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

func TestValidKey(t *testing.T) {
	long := make([]byte, maxIdempotencyKey+1)
	for i := range long {
		long[i] = 'a'
	}
	cases := []struct {
		key  string
		want bool
	}{
		{"01J9ZQ3Y5R8K", true},
		{"", false},
		{"has space", false},
		{"tab\tkey", false},
		{"é", false},
		{string(long), false},
		{string(long[:maxIdempotencyKey]), true},
	}
	for _, c := range cases {
		if got := validKey(c.key); got != c.want {
			t.Errorf("validKey(%q) = %v, want %v", c.key, got, c.want)
		}
	}
}
