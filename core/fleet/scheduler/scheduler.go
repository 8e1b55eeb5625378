// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package scheduler decides where a deployment's instances go: pure
// functions of the hosts' last readings and the deployment's needs, no
// I/O, table-tested. The server (core/fleet) reads the hosts, calls these,
// and commits the result through raft; each host's own ledger then admits
// its share or refuses it, and a refused share goes to the next host
// (Reassign).
package scheduler

import (
	"sort"
	"strings"
)

// Host is what the scheduler knows of one host.
type Host struct {
	Name string
	// Free is the most free card memory the host's ledger has, as its
	// last heartbeat said (room less charges).
	Free int64
	// Ready is false for a host whose link or relay is down.
	Ready bool
	// Draining hosts take no new placement.
	Draining bool
}

// Share is one host's part of a placement.
type Share struct {
	Host      string
	Instances int
}

// Candidates are the hosts that take placements (ready, not draining, in
// allowed when it names any), most free card memory first, then by name.
func Candidates(hosts []Host, allowed []string) []Host {
	var allow map[string]bool
	if len(allowed) > 0 {
		allow = map[string]bool{}
		for _, h := range allowed {
			allow[h] = true
		}
	}
	var out []Host
	for _, h := range hosts {
		if !h.Ready || h.Draining || (allow != nil && !allow[h.Name]) {
			continue
		}
		out = append(out, h)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Free != out[j].Free {
			return out[i].Free > out[j].Free
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// Spread places n instances over the candidates in order: one per host
// while hosts remain, then round again. Shares come in the candidates'
// order.
func Spread(n int, cands []Host) []Share {
	if len(cands) == 0 || n <= 0 {
		return nil
	}
	count := map[string]int{}
	var order []string
	for i := 0; i < n; i++ {
		h := cands[i%len(cands)].Name
		if count[h] == 0 {
			order = append(order, h)
		}
		count[h]++
	}
	out := make([]Share, 0, len(order))
	for _, h := range order {
		out = append(out, Share{Host: h, Instances: count[h]})
	}
	return out
}

// Reassign moves the instances of the refused hosts' shares to the
// candidates not tried yet, one each, in the candidates' order, and
// returns the new shares (the kept ones first) and the hosts it tried
// now. Instances no candidate is left for are dropped: the caller sees
// fewer than it needs.
func Reassign(shares []Share, refused map[string]bool, cands []Host, tried map[string]bool) ([]Share, []string) {
	var kept []Share
	pending := 0
	for _, s := range shares {
		if refused[s.Host] {
			pending += s.Instances
			continue
		}
		kept = append(kept, s)
	}
	var now []string
	for _, c := range cands {
		if pending == 0 {
			break
		}
		if tried[c.Name] {
			continue
		}
		kept = append(kept, Share{Host: c.Name, Instances: 1})
		now = append(now, c.Name)
		pending--
	}
	return kept, now
}

// Total is the number of instances of shares.
func Total(shares []Share) int {
	n := 0
	for _, s := range shares {
		n += s.Instances
	}
	return n
}

// Resize changes a placement's instance count to n: more instances go to
// the candidates after the hosts it has (one each while new hosts
// remain, then round its hosts again); fewer come off its last hosts
// first. A host that keeps none is dropped.
func Resize(shares []Share, n int, cands []Host) []Share {
	out := append([]Share(nil), shares...)
	for total := Total(out); total > n; total-- {
		last := len(out) - 1
		out[last].Instances--
		if out[last].Instances == 0 {
			out = out[:last]
		}
	}
	have := map[string]int{}
	for i, s := range out {
		have[s.Host] = i
	}
	for total := Total(out); total < n; total++ {
		added := false
		for _, c := range cands {
			if _, ok := have[c.Name]; !ok {
				have[c.Name] = len(out)
				out = append(out, Share{Host: c.Name, Instances: 1})
				added = true
				break
			}
		}
		if !added {
			if len(out) == 0 {
				return out
			}
			out[(total)%len(out)].Instances++
		}
	}
	return out
}

// Without drops a host's share and places its instances on the
// candidates, as Resize adds them (a host that is retired or lost).
func Without(shares []Share, host string, cands []Host) []Share {
	n := Total(shares)
	var kept []Share
	for _, s := range shares {
		if s.Host != host {
			kept = append(kept, s)
		}
	}
	var others []Host
	for _, c := range cands {
		if c.Name != host {
			others = append(others, c)
		}
	}
	return Resize(kept, n, others)
}

// Names lists the hosts of shares, comma-separated (for messages).
func Names(shares []Share) string {
	names := make([]string, 0, len(shares))
	for _, s := range shares {
		names = append(names, s.Host)
	}
	return strings.Join(names, ", ")
}
