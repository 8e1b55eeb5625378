// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package serverapi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/gorilla/mux"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/fleet/fsm"
)

// fakeServer answers the endpoints' Server interface from tables: the
// placements, the hosts in reach and what each host answers. A method a
// test does not expect is the embedded nil interface's: it panics, so a
// handler that reaches further than the test says fails it.
type fakeServer struct {
	Server

	placements map[string]*fsm.Placement
	inReach    map[string]bool
	// answer is a host's answer to a management call (nil: 404).
	answer func(host, method, path string, body []byte) (int, []byte)
	// metrics is each host's /metrics text.
	metrics map[string]string

	mu       sync.Mutex
	calls    []string // "host METHOD path"
	moves    []string // the moves the endpoints asked for
	statuses map[string]wire.DeploymentStatus
}

func (f *fakeServer) record(list *[]string, s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	*list = append(*list, s)
}

func (f *fakeServer) Reachable() []string {
	var out []string
	for h, ok := range f.inReach {
		if ok {
			out = append(out, h)
		}
	}
	sort.Strings(out)
	return out
}

func (f *fakeServer) InReach(host string) bool { return f.inReach[host] }

func (f *fakeServer) Call(_ context.Context, host, method, path string, _ http.Header, body []byte) (int, []byte, error) {
	f.record(&f.calls, host+" "+method+" "+path)
	if f.answer == nil {
		return http.StatusNotFound, nil, nil
	}
	status, data := f.answer(host, method, path, body)
	return status, data, nil
}

func (f *fakeServer) Metrics(_ context.Context, host string) ([]byte, bool) {
	text, ok := f.metrics[host]
	return []byte(text), ok
}

func (f *fakeServer) ServeMetrics(w http.ResponseWriter, _ *http.Request) {
	_, _ = io.WriteString(w, "capyctl_server_up 1\n")
}

func (f *fakeServer) Placement(name string) (*fsm.Placement, bool) {
	p, ok := f.placements[name]
	return p, ok
}

func (f *fakeServer) Placements() []*fsm.Placement {
	names := make([]string, 0, len(f.placements))
	for n := range f.placements {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]*fsm.Placement, 0, len(names))
	for _, n := range names {
		out = append(out, f.placements[n])
	}
	return out
}

func (f *fakeServer) Once(w http.ResponseWriter, _ *http.Request, _ []byte, do func() (int, any, error)) {
	status, v, err := do()
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, status, v)
}

func (f *fakeServer) Status(_ context.Context, p *fsm.Placement) wire.DeploymentStatus {
	if st, ok := f.statuses[p.Deployment]; ok {
		return st
	}
	return wire.DeploymentStatus{Name: p.Deployment, Revision: p.Revision}
}

func (f *fakeServer) Delete(_ context.Context, p *fsm.Placement) error {
	f.record(&f.moves, "delete "+p.Deployment)
	return nil
}

func (f *fakeServer) DeleteGroup(_ context.Context, p *fsm.Placement) error {
	f.record(&f.moves, "delete-group "+p.Deployment)
	return nil
}

func (f *fakeServer) Unplace(name string) error {
	f.record(&f.moves, "unplace "+name)
	return nil
}

func (f *fakeServer) Replace(p *fsm.Placement) error {
	f.record(&f.moves, fmt.Sprintf("replace %s@%d", p.Deployment, p.Revision))
	return nil
}

func (f *fakeServer) ForgetStatus(name string) { f.record(&f.moves, "forget "+name) }

func (f *fakeServer) Update(_ context.Context, p *fsm.Placement, raw json.RawMessage, expected uint64, activate bool) (*wire.DeploymentStatus, error) {
	f.record(&f.moves, fmt.Sprintf("update %s expected=%d activate=%v spec=%s", p.Deployment, expected, activate, raw))
	return &wire.DeploymentStatus{Name: p.Deployment, Revision: expected + 1}, nil
}

func (f *fakeServer) Action(_ context.Context, p *fsm.Placement, req wire.ActionRequest) (int, any, error) {
	f.record(&f.moves, fmt.Sprintf("%s %s wait=%v evict=%v", req.Action, p.Deployment, req.Wait, req.Evict))
	return http.StatusAccepted, wire.ActionAccepted{Deployment: p.Deployment, Action: req.Action}, nil
}

func (f *fakeServer) GroupChange(w http.ResponseWriter, r *http.Request, p *fsm.Placement, body []byte) {
	f.record(&f.moves, fmt.Sprintf("group %s %s %s", r.Method, p.Deployment, body))
	w.WriteHeader(http.StatusAccepted)
}

func (f *fakeServer) StartEvicting(context.Context, string, string) (bool, error) { return false, nil }

// serve runs one request through the routes as the management API mounts
// them (api.NewManagementHandler: under wire.Prefix, by method).
func serve(t *testing.T, f *fakeServer, method, path, body string) *httptest.ResponseRecorder {
	t.Helper()
	r := mux.NewRouter()
	for key, h := range Routes(f, func() wire.RoleInfo { return wire.RoleInfo{Role: "server"} }) {
		m, p, _ := strings.Cut(key, " ")
		if p != "/metrics" {
			p = wire.Prefix + p
		}
		r.HandleFunc(p, h).Methods(m)
	}
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest(method, path, strings.NewReader(body)))
	return w
}

// errorCode is an error answer's code ("" for a success).
func errorCode(t *testing.T, w *httptest.ResponseRecorder) string {
	t.Helper()
	if w.Code < 300 {
		return ""
	}
	var env wire.ErrorEnvelope
	if err := json.Unmarshal(w.Body.Bytes(), &env); err != nil {
		t.Fatalf("error answer %d is not an envelope: %q", w.Code, w.Body.String())
	}
	return env.Error.Code
}

// adopted is a deployment the hosts made themselves: instances spread
// over hosts in order.
func adopted(name string, shares ...fsm.HostShare) *fsm.Placement {
	return &fsm.Placement{Deployment: name, Hosts: shares, Revision: 1}
}
