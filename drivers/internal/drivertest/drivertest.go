// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package drivertest is what the first-party drivers' tests share: golden
// files (go test -update rewrites them), a free loopback port, a plan
// rendered as stable text, and the Python servers' fixture checkpoints and
// launch context.
package drivertest

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/drivers/internal/pyengine"
	"github.com/capyctl/capyctl/plugins-testkit/ports"
	"github.com/capyctl/capyctl/sdk"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// Golden compares got with testdata/<name>.golden, which go test -update
// rewrites first.
func Golden(t testing.TB, name, got string) {
	t.Helper()
	p := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%v (run go test -update after checking)", err)
	}
	if string(want) != got {
		t.Fatalf("%s differs (run go test -update after checking):\n--- got\n%s--- want\n%s", p, got, want)
	}
}

// FreePort leases a loopback port nothing listens on, for the test's life
// (plugins-testkit/ports: never handed to another test meanwhile, never one
// the kernel gives an outgoing connection).
func FreePort(t testing.TB) int {
	t.Helper()
	return ports.Lease(t)
}

// RenderPlan renders a plan as stable text for golden files: argv one
// token a line, env sorted, then the plan's other fields; every occurrence
// of each replace key is written as its value.
func RenderPlan(p *sdk.PlanResponse, replace map[string]string) string {
	var b strings.Builder
	rep := func(s string) string {
		keys := make([]string, 0, len(replace))
		for k := range replace {
			keys = append(keys, k)
		}
		// Longer first, so that a path is replaced before its parent.
		sort.Slice(keys, func(i, j int) bool { return len(keys[i]) > len(keys[j]) })
		for _, k := range keys {
			s = strings.ReplaceAll(s, k, replace[k])
		}
		return s
	}
	for _, r := range p.Refusals {
		fmt.Fprintf(&b, "refusal %s [%s] %s\n", r.Code, r.Field, rep(r.Message))
	}
	b.WriteString("# argv\n")
	for _, a := range p.Argv {
		b.WriteString(rep(a) + "\n")
	}
	b.WriteString("# env\n")
	keys := make([]string, 0, len(p.Env))
	for k := range p.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s\n", k, rep(p.Env[k]))
	}
	b.WriteString("# plan\n")
	fmt.Fprintf(&b, "workdir: %s\n", rep(p.Workdir))
	fmt.Fprintf(&b, "residency: %s\n", p.Residency)
	if ps := p.Parsers; ps != (sdk.Parsers{}) {
		fmt.Fprintf(&b, "parsers: tool_call=%q reasoning=%q provenance=%s\n", ps.ToolCall, ps.Reasoning, ps.Provenance)
	}
	if h := p.Hints; h != (sdk.MemoryHints{}) {
		fmt.Fprintf(&b, "hints: weights=%d kv_per_token=%d kv_cache=%d context=%d max_concurrent=%d source=%s\n",
			h.WeightsBytes, h.KVBytesPerToken, h.KVCacheBytes, h.ContextLength, h.MaxConcurrentRequests, h.Source)
		if h.ReadyDeviceBytes != 0 || h.ReadyHostBytes != 0 || h.StartupDeviceBytes != 0 {
			fmt.Fprintf(&b, "hints: ready_device=%d ready_host=%d startup_device=%d\n",
				h.ReadyDeviceBytes, h.ReadyHostBytes, h.StartupDeviceBytes)
		}
	}
	if l := &p.LMCache; l.Runs {
		fmt.Fprintf(&b, "lmcache: pool=%d server=%d beside_host=%d\n", l.PoolBytes, l.ServerBytes, p.Hints.BesideHostBytes)
		for _, a := range l.Argv {
			b.WriteString("lmcache argv: " + rep(a) + "\n")
		}
		keys := make([]string, 0, len(l.Env))
		for k := range l.Env {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, "lmcache env: %s=%s\n", k, rep(l.Env[k]))
		}
	}
	fmt.Fprintf(&b, "startup_timeout_ms: %d\nwake_timeout_ms: %d\n", p.StartupTimeout.Milliseconds(), p.WakeTimeout.Milliseconds())
	for _, n := range p.Notes {
		fmt.Fprintf(&b, "note: %s\n", rep(n))
	}
	return b.String()
}

// Checkpoints of the Python servers' fixtures: a Qwen3 model (whose chat
// template decides the parsers) and a Llama model (an unknown family for
// the parsers).
const (
	Qwen3Config = `{"model_type":"qwen3","num_hidden_layers":28,"num_attention_heads":16,"num_key_value_heads":8,"hidden_size":1024,"head_dim":128,"torch_dtype":"bfloat16","max_position_embeddings":40960}`
	LlamaConfig = `{"model_type":"llama","num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"hidden_size":4096,"torch_dtype":"bfloat16","max_position_embeddings":131072}`
)

// WriteModels writes the two fixture checkpoints under root/models, the
// Qwen3 one (3 GiB of sparse weights) with qwen3Tokenizer as its
// tokenizer_config.json, the Llama one (16 GiB) without one, and returns
// their directories.
func WriteModels(t testing.TB, root, qwen3Tokenizer string) (qwen3, llama string) {
	t.Helper()
	qwen3, llama = filepath.Join(root, "models", "qwen3"), filepath.Join(root, "models", "llama")
	if err := pyengine.MakeModel(qwen3, Qwen3Config, qwen3Tokenizer, 3<<30); err != nil {
		t.Fatal(err)
	}
	if err := pyengine.MakeModel(llama, LlamaConfig, "", 16<<30); err != nil {
		t.Fatal(err)
	}
	return qwen3, llama
}

// LaunchContext is a launch of instance chat/0 on one 80 GiB card, 20 GiB
// of it for the engine, on port.
func LaunchContext(port int) *sdk.LaunchContext {
	return &sdk.LaunchContext{
		Port: int32(port), DeviceUUIDs: []string{"GPU-11111111-2222-3333-4444-555555555555"},
		DeviceBytes: 20 << 30, DeviceTotalBytes: 80 << 30, KVCacheBytes: 4 << 30,
		LaunchDir: "/state/launches/chat/0-L1", InstanceID: "chat/0", LaunchID: "L1",
	}
}

// Member is rank of a group of size machines on loopback: topology tp × pp,
// the head at 127.0.0.1:port, this host's peer address 127.0.0.1.
func Member(rank, size, tp, pp, port int32) *sdk.Group {
	return &sdk.Group{Rank: rank, Size: size, TensorParallel: tp, PipelineParallel: pp,
		HeadAddress: "127.0.0.1", RendezvousPort: port, PeerAddress: "127.0.0.1"}
}

// ArgsAfter returns the n tokens of argv that follow the first occurrence
// of option, nil when it is absent.
func ArgsAfter(argv []string, option string, n int) []string {
	for i, a := range argv {
		if a == option && i+n < len(argv) {
			return argv[i+1 : i+1+n]
		}
	}
	return nil
}

// Has reports whether argv holds the token.
func Has(argv []string, token string) bool {
	for _, a := range argv {
		if a == token {
			return true
		}
	}
	return false
}

// Value is *p, or T's zero value when p is nil: a table's optional request
// part (a host policy, a launch context) left out of a case.
func Value[T any](p *T) T {
	if p == nil {
		var zero T
		return zero
	}
	return *p
}
