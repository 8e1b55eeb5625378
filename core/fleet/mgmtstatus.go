// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"sync"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
)

// statusCache keeps each host's last answer for a deployment, so a
// deployment on a lost host still shows, uncertain.
type statusCache struct {
	mu sync.Mutex
	m  map[string]wire.DeploymentStatus // "<deployment>\x00<host>"
}

// deploymentStatus merges a placement's hosts' statuses into one: the
// instances numbered through the hosts in placement order, each naming its
// host; a host out of reach contributes its last known instances as
// uncertain.
func (s *Server) deploymentStatus(ctx context.Context, p *Placement) wire.DeploymentStatus {
	type answer struct {
		st wire.DeploymentStatus
		ok bool
	}
	answers := make([]answer, len(p.Hosts))
	var wg sync.WaitGroup
	for i, hs := range p.Hosts {
		wg.Add(1)
		go func(i int, hs HostShare) {
			defer wg.Done()
			st, ok := s.hostStatus(ctx, p, hs) // from its journals where they answer (journalstatus.go)
			answers[i] = answer{st, ok}
		}(i, hs)
	}
	wg.Wait()
	out := wire.DeploymentStatus{Name: p.Deployment, Routes: p.Routes, Revision: p.Revision, Instances: []wire.InstanceStatus{}}
	idx := 0
	states := map[string]int{}
	for i, hs := range p.Hosts {
		a := answers[i]
		if !a.ok {
			s.lastStatus.mu.Lock()
			cached, had := s.lastStatus.m[p.Deployment+"\x00"+hs.Host]
			s.lastStatus.mu.Unlock()
			if !had {
				for k := 0; k < hs.Instances; k++ {
					out.Instances = append(out.Instances, wire.InstanceStatus{Index: idx, Host: hs.Host, State: stateUncertain})
					idx++
				}
				continue
			}
			a.st = cached
			a.st.Instances = append([]wire.InstanceStatus(nil), cached.Instances...) // the cache's own stays as it is
			for k := range a.st.Instances {
				a.st.Instances[k].State = stateUncertain
			}
			a.st.ReadyN = 0
		}
		if out.Engine == "" {
			out.Engine, out.API, out.Desired, out.Spec, out.UpdatedAt = a.st.Engine, a.st.API, a.st.Desired, a.st.Spec, a.st.UpdatedAt
			out.Revision = a.st.Revision
			if len(a.st.Routes) > 0 {
				out.Routes = a.st.Routes
			}
			out.Memory = a.st.Memory
		}
		out.Requests = sumCounts(out.Requests, a.st.Requests)
		out.ReadyN += a.st.ReadyN
		for _, in := range a.st.Instances {
			in.Index, in.Host, in.ID = idx, hs.Host, structs.InstanceID(p.Deployment, idx)
			idx++
			states[in.State]++
			out.Instances = append(out.Instances, in)
		}
	}
	out.State = mergeState(states, len(out.Instances), out.ReadyN)
	if p.Managed() && p.Desired != "" {
		out.Desired = p.Desired // the cluster's word, which the hosts follow
	}
	if out.Spec != nil {
		spec := *out.Spec
		spec.Instances = len(out.Instances)
		out.Spec = &spec
	}
	if p.Group != nil {
		s.groupStatus(p, &out)
	}
	return out
}

// sumCounts adds a host's request counts to the sum so far (numbers are
// summed; anything else keeps the first host's).
func sumCounts(sum, add map[string]any) map[string]any {
	if add == nil {
		return sum
	}
	if sum == nil {
		sum = map[string]any{}
	}
	for k, v := range add {
		n, isNum := v.(float64)
		if prev, ok := sum[k].(float64); ok && isNum {
			sum[k] = prev + n
		} else if _, had := sum[k]; !had {
			sum[k] = v
		}
	}
	return sum
}

// mergeState aggregates instance states the way a single role does: all
// alike is that state; some ready is degraded.
func mergeState(states map[string]int, n, ready int) string {
	if n == 0 {
		return string(structs.StateStopped)
	}
	if ready == n {
		return "ready"
	}
	if len(states) == 1 {
		for st := range states {
			return st
		}
	}
	if ready > 0 {
		return "degraded"
	}
	for _, st := range []string{"uncertain", "failed", "starting", "waking", "stopping", "parked"} {
		if states[st] > 0 {
			return st
		}
	}
	return "degraded"
}
