// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package soak

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// table renders the run: the operations by kind with their outcomes and
// durations, the requests by outcome, and the quiet points' readings.
func (r *Runner) table() string {
	var b strings.Builder
	points, role := r.quiet.points, "the role"
	if r.fleet != nil {
		points, role = r.fleet.server.points, "the server"
	}
	fmt.Fprintf(&b, "Soak run: profile %s, seed %d, %d operations in %s, %d quiet points, %d lives of %s.\n\n",
		r.profile.Name, r.seed, r.ops, time.Since(r.start).Round(time.Second), points, r.roleLives, role)
	b.WriteString("| operation | count | outcomes | median | p99 |\n|---|---|---|---|---|\n")
	kinds := make([]string, 0, len(r.stats))
	for k := range r.stats {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		s := r.stats[k]
		med, p99 := quantiles(s.took)
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s |\n", k, s.n, counts(s.outcomes), med, p99)
	}
	b.WriteString("\n| requests ended | count |\n|---|---|\n")
	out := r.reqs.snapshotOutcomes()
	names := make([]string, 0, len(out))
	for k := range out {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Fprintf(&b, "| %s | %d |\n", k, out[k])
	}
	fmt.Fprintf(&b, "\n| quiet points | value |\n|---|---|\n")
	if r.fleet == nil {
		fmt.Fprintf(&b, "| states seen (distinct baselines) | %d |\n", len(r.quiet.baselines))
		fmt.Fprintf(&b, "| role goroutines, most at a quiet point | %.0f |\n", r.quiet.maxGoroutines)
		fmt.Fprintf(&b, "| role open files, most at a quiet point | %.0f |\n", r.quiet.maxFDs)
	}
	for i, l := range r.quiet.lives {
		if len(l) == 0 {
			continue
		}
		fmt.Fprintf(&b, "| role RSS, life %d (%d quiet points): first, lowest, highest, last | %s, %s, %s, %s |\n",
			i+1, len(l), mib(l[0]), mib(minOf(l)), mib(maxOf(l)), mib(l[len(l)-1]))
	}
	if f := r.fleet; f != nil {
		lives := func(who string, q *quietState) {
			for i, l := range q.lives {
				if len(l) > 0 {
					fmt.Fprintf(&b, "| %s RSS, life %d (%d quiet points): first, lowest, highest, last | %s, %s, %s, %s |\n",
						who, i+1, len(l), mib(l[0]), mib(minOf(l)), mib(maxOf(l)), mib(l[len(l)-1]))
				}
			}
		}
		lives("server", &f.server)
		for _, name := range f.names {
			fmt.Fprintf(&b, "| host %s goroutines, open files: most at a quiet point | %.0f, %.0f |\n", name, f.quiet[name].maxGoroutines, f.quiet[name].maxFDs)
			lives("host "+name, f.quiet[name])
		}
	}
	return b.String()
}

// counts renders outcome counts, most frequent first.
func counts(m map[string]int) string {
	type kv struct {
		k string
		v int
	}
	var list []kv
	for k, v := range m {
		list = append(list, kv{k, v})
	}
	sort.Slice(list, func(i, j int) bool {
		if list[i].v != list[j].v {
			return list[i].v > list[j].v
		}
		return list[i].k < list[j].k
	})
	parts := make([]string, len(list))
	for i, e := range list {
		parts[i] = fmt.Sprintf("%s %d", e.k, e.v)
	}
	return strings.Join(parts, ", ")
}

// quantiles are the median and the 99th percentile of durations.
func quantiles(d []time.Duration) (string, string) {
	if len(d) == 0 {
		return "", ""
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	q := func(p float64) string {
		i := int(p * float64(len(s)-1))
		return s[i].Round(time.Millisecond).String()
	}
	return q(0.5), q(0.99)
}
