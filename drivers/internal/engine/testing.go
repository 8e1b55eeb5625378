// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package engine

import (
	"fmt"
	"sort"
	"strings"

	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
)

// RenderPlan renders a plan as stable text for golden files: argv one
// token a line, env sorted, then the plan's other fields; every occurrence
// of each replace key is written as its value.
func RenderPlan(p *pb.PlanResponse, replace map[string]string) string {
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
	for _, r := range p.GetRefusals() {
		fmt.Fprintf(&b, "refusal %s [%s] %s\n", r.GetCode(), r.GetField(), rep(r.GetMessage()))
	}
	b.WriteString("# argv\n")
	for _, a := range p.GetArgv() {
		b.WriteString(rep(a) + "\n")
	}
	b.WriteString("# env\n")
	keys := make([]string, 0, len(p.GetEnv()))
	for k := range p.GetEnv() {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s\n", k, rep(p.GetEnv()[k]))
	}
	b.WriteString("# plan\n")
	fmt.Fprintf(&b, "workdir: %s\n", rep(p.GetWorkdir()))
	fmt.Fprintf(&b, "residency: %s\n", p.GetResidency())
	if ps := p.GetParsers(); ps != nil {
		fmt.Fprintf(&b, "parsers: tool_call=%q reasoning=%q provenance=%s\n", ps.GetToolCall(), ps.GetReasoning(), ps.GetProvenance())
	}
	if h := p.GetHints(); h != nil {
		fmt.Fprintf(&b, "hints: weights=%d kv_per_token=%d kv_cache=%d context=%d max_concurrent=%d source=%s\n",
			h.GetWeightsBytes(), h.GetKvBytesPerToken(), h.GetKvCacheBytes(), h.GetContextLength(), h.GetMaxConcurrentRequests(), h.GetSource())
	}
	fmt.Fprintf(&b, "startup_timeout_ms: %d\nwake_timeout_ms: %d\n", p.GetStartupTimeoutMs(), p.GetWakeTimeoutMs())
	for _, n := range p.GetNotes() {
		fmt.Fprintf(&b, "note: %s\n", rep(n))
	}
	return b.String()
}
