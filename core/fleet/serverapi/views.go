// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package serverapi

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/mux"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/structs"
)

func (e *endpoints) listEngines(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, wire.EngineList{APIVersion: wire.APIVersion, Engines: e.engines(r.Context())})
}

// engines merges the hosts' registered engines, each name once.
func (e *endpoints) engines(ctx context.Context) []wire.Engine {
	seen := map[string]bool{}
	out := []wire.Engine{}
	ctx, cancel := context.WithTimeout(ctx, FanOutTimeout)
	defer cancel()
	for _, host := range e.s.Reachable() {
		status, data, err := e.s.Call(ctx, host, http.MethodGet, "/engines", nil, nil)
		if err != nil || status != http.StatusOK {
			continue
		}
		var list wire.EngineList
		if json.Unmarshal(data, &list) != nil {
			continue
		}
		for _, e := range list.Engines {
			if !seen[e.Name] {
				seen[e.Name] = true
				out = append(out, e)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// toAllHosts relays an engine registration or removal to every reachable
// host (?host=NAME: that one only) and answers the last host's answer, or
// the first refusal.
func (e *endpoints) toAllHosts(w http.ResponseWriter, r *http.Request) {
	body, err := ReadBody(r)
	if err != nil {
		writeError(w, err)
		return
	}
	hosts := e.s.Reachable()
	if only := r.URL.Query().Get("host"); only != "" {
		hosts = []string{only}
	}
	if len(hosts) == 0 {
		writeError(w, structs.Errf(structs.CodeHostUnreachable, "no host is connected to the server (capyctl list hosts)"))
		return
	}
	path := strings.TrimPrefix(r.URL.Path, wire.Prefix)
	var status int
	var data []byte
	for _, host := range hosts {
		status, data, err = e.s.Call(r.Context(), host, r.Method, path, r.Header, body)
		if err == nil && status >= 300 {
			err = hostError(host, status, data)
		}
		if err != nil {
			writeError(w, err)
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(data)
}

// toAnyHost answers a read any host answers alike (a family's flag
// policy).
func (e *endpoints) toAnyHost(w http.ResponseWriter, r *http.Request) {
	hosts := e.s.Reachable()
	if len(hosts) == 0 {
		writeError(w, structs.Errf(structs.CodeHostUnreachable, "no host is connected to the server (capyctl list hosts)"))
		return
	}
	e.relayAnswer(w, r, hosts[0], strings.TrimPrefix(r.URL.RequestURI(), wire.Prefix))
}

func (e *endpoints) hostLedger(w http.ResponseWriter, r *http.Request) {
	name := mux.Vars(r)["name"]
	if !e.s.HostKnown(name) {
		writeError(w, structs.Errf(structs.CodeNotFound, "no host %s", name))
		return
	}
	if !e.s.InReach(name) {
		writeError(w, structs.Errf(structs.CodeHostUnreachable, "host %s is out of reach", name).WithDetail("host", name))
		return
	}
	e.relayAnswer(w, r, name, "/hosts/"+url.PathEscape(name)+"/ledger")
}

// hostViews asks each reachable host for a view and returns the answers
// that decoded, by host.
func (e *endpoints) hostViews(r *http.Request, v func() any) map[string]any {
	out := map[string]any{}
	ctx, cancel := context.WithTimeout(r.Context(), FanOutTimeout)
	defer cancel()
	for _, host := range e.s.Reachable() {
		status, data, err := e.s.Call(ctx, host, http.MethodGet, strings.TrimPrefix(r.URL.RequestURI(), wire.Prefix), nil, nil)
		if err != nil || status != http.StatusOK {
			continue
		}
		dst := v()
		if json.Unmarshal(data, dst) == nil {
			out[host] = dst
		}
	}
	return out
}

// loadView merges the hosts' load views: a deployment's counts summed over
// its hosts, its instances numbered deployment-wide as in its status.
func (e *endpoints) loadView(w http.ResponseWriter, r *http.Request) {
	merged := map[string]*wire.DeploymentLoad{}
	var order []string
	views := e.hostViews(r, func() any { return &wire.LoadResponse{} })
	for _, p := range e.s.Placements() {
		offset := 0
		for _, hs := range p.Hosts {
			lv, ok := views[hs.Host].(*wire.LoadResponse)
			if !ok {
				offset += hs.Instances
				continue
			}
			for _, dl := range lv.Deployments {
				if dl.Deployment != p.Deployment {
					continue
				}
				m := merged[dl.Deployment]
				if m == nil {
					m = &wire.DeploymentLoad{Deployment: dl.Deployment, Requests: wire.RequestCounts{Places: dl.Requests.Places, MaxWaiting: dl.Requests.MaxWaiting}}
					merged[dl.Deployment] = m
					order = append(order, dl.Deployment)
				}
				c := dl.Requests
				m.Requests.Waiting += c.Waiting
				m.Requests.InFlight += c.InFlight
				m.Requests.SettleWhenIdle += c.SettleWhenIdle
				m.Requests.SettleAtStop += c.SettleAtStop
				m.Requests.SettleOnAbort += c.SettleOnAbort
				for _, ic := range c.Instances {
					ic.ID = globalID(p.Deployment, ic.ID, offset)
					m.Requests.Instances = append(m.Requests.Instances, ic)
				}
				for id, el := range dl.Engines {
					if m.Engines == nil {
						m.Engines = map[string]wire.EngineLoad{}
					}
					m.Engines[globalID(p.Deployment, id, offset)] = el
				}
			}
			offset += hs.Instances
		}
	}
	out := wire.LoadResponse{APIVersion: wire.APIVersion, At: time.Now().UTC(), Deployments: []wire.DeploymentLoad{}}
	for _, name := range order {
		out.Deployments = append(out.Deployments, *merged[name])
	}
	writeJSON(w, http.StatusOK, out)
}

// globalID turns a host's instance ID ("demo/0") into the deployment-wide
// one, given the host's first index.
func globalID(dep, id string, offset int) string {
	i := strings.LastIndexByte(id, '/')
	if i < 0 {
		return id
	}
	n, err := strconv.Atoi(id[i+1:])
	if err != nil {
		return id
	}
	return structs.InstanceID(dep, n+offset)
}

// latencyView lists every host's latency distributions, each naming its
// host.
func (e *endpoints) latencyView(w http.ResponseWriter, r *http.Request) {
	type latency struct {
		Deployments []map[string]any `json:"deployments"`
	}
	deps := []map[string]any{}
	views := e.hostViews(r, func() any { return &latency{} })
	hosts := make([]string, 0, len(views))
	for h := range views {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	for _, h := range hosts {
		for _, d := range views[h].(*latency).Deployments {
			d["host"] = h
			deps = append(deps, d)
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"api_version": wire.APIVersion, "at": time.Now().UTC(), "deployments": deps})
}

// perHostText answers /metrics with the server's own series, then every
// reachable host's, each of those labelled with its host.
func (e *endpoints) perHostText(w http.ResponseWriter, r *http.Request) {
	r.Header.Del("Accept") // the text format, which the hosts' series follow
	r.Header.Del("Accept-Encoding")
	e.s.ServeMetrics(w, r)
	for _, host := range e.s.Reachable() {
		func() {
			ctx, cancel := context.WithTimeout(r.Context(), FanOutTimeout)
			defer cancel()
			if data, ok := e.s.Metrics(ctx, host); ok {
				_, _ = w.Write(labelHost(data, host))
			}
		}()
	}
}

// labelHost adds host="<name>" to every sample of a Prometheus text
// exposition.
func labelHost(text []byte, host string) []byte {
	var b bytes.Buffer
	label := `host="` + host + `"`
	for _, line := range strings.Split(string(text), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			if strings.HasPrefix(line, "#") {
				continue // one HELP/TYPE per host would repeat; the samples carry the names
			}
			continue
		}
		if i := strings.IndexByte(line, '{'); i >= 0 {
			line = line[:i+1] + label + "," + line[i+1:]
		} else if i := strings.IndexByte(line, ' '); i >= 0 {
			line = line[:i] + "{" + label + "}" + line[i:]
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

func (e *endpoints) snapshot(w http.ResponseWriter, r *http.Request, role wire.RoleInfo) {
	cursor, err := e.s.EventCursor()
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, wire.Snapshot{APIVersion: wire.APIVersion, Cursor: cursor, TakenAt: time.Now().UTC(), Role: role,
		Deployments: e.allStatuses(r.Context()), Engines: e.engines(r.Context()), Hosts: e.s.HostList()})
}

func (e *endpoints) listDeployments(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, wire.DeploymentList{APIVersion: wire.APIVersion, Deployments: e.allStatuses(r.Context())})
}

// allStatuses is every placement's merged status, asked all at once.
func (e *endpoints) allStatuses(ctx context.Context) []wire.DeploymentStatus {
	ps := e.s.Placements()
	out := make([]wire.DeploymentStatus, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Add(1)
		go func(i int, p *fsm.Placement) {
			defer wg.Done()
			out[i] = e.s.Status(ctx, p)
		}(i, p)
	}
	wg.Wait()
	return out
}

func (e *endpoints) getDeployment(w http.ResponseWriter, r *http.Request) {
	p, err := e.placementOf(mux.Vars(r)["name"])
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, e.s.Status(r.Context(), p))
}
