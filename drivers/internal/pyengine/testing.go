// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pyengine

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
)

// MakeVenv writes a minimal environment under dir for tests and fakes:
// bin/python (a copy of interpreter, or an empty executable when it is
// ""), and one *.dist-info per name=version in dists, with any extra files
// (paths relative to site-packages). It returns the root.
func MakeVenv(dir, interpreter string, dists map[string]string, extra map[string]string) (string, error) {
	sp := filepath.Join(dir, "lib", "python3.12", "site-packages")
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		return "", err
	}
	py := filepath.Join(dir, "bin", "python")
	var data []byte
	if interpreter != "" {
		b, err := os.ReadFile(interpreter)
		if err != nil {
			return "", err
		}
		data = b
	}
	if err := os.WriteFile(py, data, 0o755); err != nil {
		return "", err
	}
	names := make([]string, 0, len(dists))
	for n := range dists {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		ver := dists[name]
		di := filepath.Join(sp, NormalizeDistName(name)+"-"+ver+".dist-info")
		if err := os.MkdirAll(di, 0o755); err != nil {
			return "", err
		}
		meta := fmt.Sprintf("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: test\n\nA description.\n", name, ver)
		if err := os.WriteFile(filepath.Join(di, "METADATA"), []byte(meta), 0o644); err != nil {
			return "", err
		}
		record := fmt.Sprintf("%s/__init__.py,sha256=x,1\n%s-%s.dist-info/METADATA,,\n", NormalizeDistName(name), NormalizeDistName(name), ver)
		if err := os.WriteFile(filepath.Join(di, "RECORD"), []byte(record), 0o644); err != nil {
			return "", err
		}
	}
	for rel, s := range extra {
		p := filepath.Join(sp, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			return "", err
		}
	}
	return dir, nil
}

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
