// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/plugins-testkit/conformance"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// Fleet is a server and its hosts, each a separate capyctl process on
// loopback, driven through the CLI and the APIs only.
type Fleet struct {
	T      *testing.T
	Server *harness.Role
	Hosts  map[string]*harness.Role
}

// StartFleet starts a server (heartbeats every 300 ms, so a lost host is
// noticed within a second) and hosts with the given simulated cards, and
// registers the fake engine on every host through the server.
func StartFleet(t *testing.T, cards map[string]string) *Fleet {
	t.Helper()
	f := &Fleet{T: t, Hosts: map[string]*harness.Role{}}
	f.Server = harness.StartServer(t, harness.Options{Args: []string{"--set", "host_heartbeat=300ms"}})
	for name, mem := range cards {
		f.Hosts[name] = harness.StartHost(t, f.Server, harness.HostOptions{Name: name,
			GPU: harness.SimGPU{DeviceMemory: mem, SystemLimit: "16GiB", SystemReserve: "1GiB"}})
	}
	f.WaitHosts(len(cards), wire.HostReady)
	f.Server.AddFakeEngine("fake")
	f.WaitEngine("fake")
	return f
}

// WaitEngine waits until every host lists an engine registered through
// the server (the hosts' inventories come with their next heartbeat).
func (f *Fleet) WaitEngine(name string) {
	f.T.Helper()
	poll.Until(f.T, 10*time.Second, "every host lists engine "+name, func() bool {
		for _, h := range f.HostList() {
			if !slices.Contains(h.Engines, name) {
				return false
			}
		}
		return true
	})
}

// HostList is `list hosts --json` on the server.
func (f *Fleet) HostList() []wire.Host {
	f.T.Helper()
	out, errOut, code := f.Server.CLI("list", "hosts", "--json")
	if code != 0 {
		f.T.Fatalf("list hosts: exit %d: %s", code, errOut)
	}
	var hosts []wire.Host
	if err := json.Unmarshal([]byte(out), &hosts); err != nil {
		f.T.Fatalf("list hosts --json: %v\n%s", err, out)
	}
	return hosts
}

// HostState is a host's state in `list hosts`, or "" when it is not listed.
func (f *Fleet) HostState(name string) string {
	for _, h := range f.HostList() {
		if h.Name == name {
			return h.State
		}
	}
	return ""
}

// WaitHosts waits until n hosts are in state.
func (f *Fleet) WaitHosts(n int, state string) {
	f.T.Helper()
	poll.Until(f.T, 30*time.Second, "hosts "+state, func() bool {
		c := 0
		for _, h := range f.HostList() {
			if h.State == state {
				c++
			}
		}
		return c == n
	})
}

// Deploy writes the model directory on every host and deploys through the
// server.
func (f *Fleet) Deploy(name, spec string, args ...string) (string, string, int) {
	f.T.Helper()
	for _, h := range f.Hosts {
		h.WriteFile("models/"+name+"/README", "fake model\n")
	}
	return f.Server.Deploy(name, spec, args...)
}

// Status is `status deployment <name> --json` on the server.
func (f *Fleet) Status(name string) wire.DeploymentStatus {
	f.T.Helper()
	return Status(f.T, f.Server, name)
}

// MgmtGet reads a management route of the server into v.
func (f *Fleet) MgmtGet(path string, v any) {
	f.T.Helper()
	a := f.MgmtDo(http.MethodGet, path, nil, "")
	if a.Err != nil {
		f.T.Fatal(a.Err)
	}
	if a.Status != http.StatusOK {
		f.T.Fatalf("GET %s: %d %s", path, a.Status, a.Body)
	}
	if err := json.Unmarshal([]byte(a.Body), v); err != nil {
		f.T.Fatalf("GET %s: %v\n%s", path, err, a.Body)
	}
}

// HostCharged sums the charges of a host's ledger domains, read with
// `status host <name> --json` on the server.
func (f *Fleet) HostCharged(name string) (charged int64) {
	f.T.Helper()
	out, errOut, code := f.Server.CLI("status", "host", name, "--json")
	if code != 0 {
		f.T.Fatalf("status host %s: exit %d: %s", name, code, errOut)
	}
	var h wire.HostDetail
	if err := json.Unmarshal([]byte(out), &h); err != nil {
		f.T.Fatalf("status host --json: %v\n%s", err, out)
	}
	for _, d := range h.Ledger {
		m, _ := d.(map[string]any)
		c, _ := m["charged_bytes"].(float64)
		charged += int64(c)
	}
	return charged
}

// MgmtAnswer is one management call's answer.
type MgmtAnswer struct {
	Status int
	Header http.Header
	Body   string
	Err    error
}

// MgmtDo makes one call on the server's management API.
func (f *Fleet) MgmtDo(method, path string, headers map[string]string, body string) MgmtAnswer {
	req, err := http.NewRequest(method, "http://"+f.Server.Info.Management+path, strings.NewReader(body))
	if err != nil {
		return MgmtAnswer{Err: err}
	}
	req.Header.Set("Authorization", "Bearer "+f.Server.Creds.AdminToken)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return MgmtAnswer{Err: err}
	}
	return MgmtAnswer{Status: resp.StatusCode, Header: resp.Header, Body: harness.ReadAll(resp)}
}

// MgmtDoReached is MgmtDo with Expect: 100-continue: reached is closed
// once the server's handler reads the body (the server answers 100
// Continue then), so the call is in the server's hands, past its routing
// and authentication.
func (f *Fleet) MgmtDoReached(method, path string, headers map[string]string, body string, reached chan<- struct{}) MgmtAnswer {
	trace := &httptrace.ClientTrace{Got100Continue: func() { close(reached) }}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), method,
		"http://"+f.Server.Info.Management+path, strings.NewReader(body))
	if err != nil {
		return MgmtAnswer{Err: err}
	}
	req.Header.Set("Authorization", "Bearer "+f.Server.Creds.AdminToken)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Expect", "100-continue")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	tr := &http.Transport{ExpectContinueTimeout: time.Minute}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return MgmtAnswer{Err: err}
	}
	return MgmtAnswer{Status: resp.StatusCode, Header: resp.Header, Body: harness.ReadAll(resp)}
}

// LedgerWithinLimits reads a host's ledger through the server and reports
// any domain charged over its room. A ledger it cannot read is not within
// limits: a reading that proves nothing says so.
func (f *Fleet) LedgerWithinLimits(host string) (string, bool) {
	a := f.MgmtDo(http.MethodGet, wire.Prefix+"/hosts/"+host+"/ledger", nil, "")
	if a.Err != nil || a.Status != http.StatusOK {
		return fmt.Sprintf("the ledger of %s could not be read: %v %d %s", host, a.Err, a.Status, a.Body), false
	}
	var answer struct {
		Ledger wire.LedgerView `json:"ledger"`
	}
	if err := json.Unmarshal([]byte(a.Body), &answer); err != nil {
		return fmt.Sprintf("ledger of %s: %v", host, err), false
	}
	v := answer.Ledger
	if len(v.Domains) == 0 {
		return fmt.Sprintf("the ledger of %s has no domain: %s", host, a.Body), false
	}
	for _, d := range v.Domains {
		if d.Charged > d.Room {
			return fmt.Sprintf("host %s's domain %s charged %d over its room %d (owners %+v)", host, d.Name, d.Charged, d.Room, v.Owners), false
		}
	}
	return "", true
}

// DeployEverywhere writes a fake checkpoint for name on every host, at the
// same path (a group's members read the same model files), and deploys.
func (f *Fleet) DeployEverywhere(name, spec string, args ...string) (string, string, int) {
	f.T.Helper()
	for _, h := range f.Hosts {
		conformance.FakeModel(f.T, filepath.Join(h.StateDir, "models", name), 1<<20)
	}
	return f.Server.Deploy(name, spec, args...)
}

// LedgersWithinLimits fails the test when a host's ledger charges more
// than a domain's room, or cannot be read (every host is reachable where
// it is called: a ledger not read is not within limits).
func (f *Fleet) LedgersWithinLimits(when string) {
	f.T.Helper()
	for name := range f.Hosts {
		if msg, ok := f.LedgerWithinLimits(name); !ok {
			f.T.Fatalf("%s: %s", when, msg)
		}
	}
}

// DumpOnFailure logs, when the test failed, the server's fleet log lines
// and the tail of every engine log on every host.
func (f *Fleet) DumpOnFailure() {
	t := f.T
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		var lines []string
		for _, l := range strings.Split(f.Server.Output(), "\n") {
			if strings.Contains(l, "capyctl.fleet") {
				lines = append(lines, l)
			}
		}
		t.Logf("server's fleet log:\n%s", strings.Join(lines, "\n"))
		for name, h := range f.Hosts {
			logs, _ := filepath.Glob(filepath.Join(h.StateDir, "*", "*", "*", "engine.log"))
			for _, l := range logs {
				data, _ := os.ReadFile(l)
				if len(data) > 3000 {
					data = data[len(data)-3000:]
				}
				t.Logf("host %s: %s:\n%s", name, l, data)
			}
		}
	})
}

// MemberStates lists a group's members' states in rank order.
func MemberStates(st wire.DeploymentStatus) []string {
	out := make([]string, len(st.Instances))
	for i, in := range st.Instances {
		out[i] = in.State
	}
	return out
}

// WaitGroup waits until every member of a group is in state.
func (f *Fleet) WaitGroup(name, state string, within time.Duration) wire.DeploymentStatus {
	f.T.Helper()
	var st wire.DeploymentStatus
	poll.Until(f.T, within, name+" "+state, func() bool {
		st = f.Status(name)
		for _, s := range MemberStates(st) {
			if s != state {
				return false
			}
		}
		return len(st.Instances) > 0
	})
	return st
}

// WaitGroupStopped waits until the server stopped a whole group for code.
func (f *Fleet) WaitGroupStopped(name, code string) {
	f.T.Helper()
	var st wire.DeploymentStatus
	deadline := time.Now().Add(30 * time.Second)
	for {
		st = f.Status(name)
		done := st.Group != nil && st.Group.LastError != nil && string(st.Group.LastError.Code) == code
		for _, s := range MemberStates(st) {
			done = done && s == "stopped"
		}
		if done {
			return
		}
		if time.Now().After(deadline) {
			f.T.Fatalf("%s not stopped by the server with %s: members %v, group %+v", name, code, MemberStates(st), st.Group)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// NoGroupEngine waits until no engine process of a group's members runs.
func (f *Fleet) NoGroupEngine(pids map[string]int) {
	f.T.Helper()
	for host, pid := range pids {
		if pid == 0 {
			continue
		}
		poll.Until(f.T, 30*time.Second, fmt.Sprintf("engine %d on %s gone", pid, host), func() bool { return !harness.Alive(pid) })
	}
}
