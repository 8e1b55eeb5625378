// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/api"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/runinfo"
	"github.com/capyctl/capyctl/core/structs"
)

// These tests run the host commands against core/api's real management
// handler served by httptest, with the role's pieces faked: a Backend
// whose Hosts and Fleet are in memory. That exercises the CLI's own work
// (the requests it sends, its exit codes, its tables and summaries) and the
// real routes, decoding and error envelope, but none of a server's
// behaviour: the figures below are what a server would report, made up for
// the formatting. A real standalone role answers the same commands in
// cmd/capyctl's TestCLI_RoleWithoutEngine.

const testAdminToken = "test-admin-token"

// testNow is the fixed clock of every command in these tests.
var testNow = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

// request is one call the management handler received.
type request struct {
	Method, Path, Body string
}

// fakeFleet is a server's joined hosts in memory; it records what each
// call received, after the real handler decoded the request.
type fakeFleet struct {
	mu      sync.Mutex
	hosts   map[string]wire.HostDetail
	cluster string
	// tokens are the (host name, ttl) of each NewJoinToken call.
	tokens []tokenCall
	// fail, when set, answers every Drain and Remove.
	fail error
}

type tokenCall struct {
	Host string
	TTL  time.Duration
}

func (f *fakeFleet) NewJoinToken(hostName string, ttl time.Duration) (wire.JoinToken, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tokens = append(f.tokens, tokenCall{hostName, ttl})
	return wire.JoinToken{
		Token: "capyjoin1.3f9a0c.s3cr3t", ExpiresAt: testNow.Add(ttl), CAFingerprint: "3f9a0c",
		HostName: hostName, ClusterAddress: f.cluster,
	}, nil
}

func (f *fakeFleet) Host(name string) (wire.HostDetail, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	h, ok := f.hosts[name]
	if !ok {
		return wire.HostDetail{}, structs.Errf(structs.CodeNotFound, "no host %s", name)
	}
	return h, nil
}

func (f *fakeFleet) Drain(name string, drain bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	h, ok := f.hosts[name]
	if !ok {
		return structs.Errf(structs.CodeNotFound, "no host %s", name)
	}
	h.State = wire.HostReady
	if drain {
		h.State = wire.HostDraining
	}
	f.hosts[name] = h
	return nil
}

func (f *fakeFleet) Remove(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	if _, ok := f.hosts[name]; !ok {
		return structs.Errf(structs.CodeNotFound, "no host %s", name)
	}
	delete(f.hosts, name)
	return nil
}

// setFail sets the error every Drain and Remove answers (nil: none).
func (f *fakeFleet) setFail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = err
}

// tokenCalls returns the NewJoinToken calls so far.
func (f *fakeFleet) tokenCalls() []tokenCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]tokenCall(nil), f.tokens...)
}

func (f *fakeFleet) list() []wire.Host {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := []wire.Host{}
	for _, name := range []string{"gpu-b", "gpu-c"} {
		if h, ok := f.hosts[name]; ok {
			out = append(out, h.Host)
		}
	}
	return out
}

func at(t time.Time) *time.Time { return &t }

// newFleet returns two joined hosts: gpu-b ready with two cards and two
// instances, gpu-c lost with an expired certificate.
func newFleet() *fakeFleet {
	const gib = int64(1) << 30
	return &fakeFleet{cluster: "10.0.0.1:7444", hosts: map[string]wire.HostDetail{
		"gpu-b": {Host: wire.Host{
			Name: "gpu-b", Online: true, Role: "host", Engines: []string{"vllm", "sglang"},
			GPUs: []wire.GPU{
				{Index: 0, UUID: "GPU-aa", Name: "H100", TotalBytes: 80 * gib, UsedBytes: 60 * gib},
				{Index: 1, UUID: "GPU-bb", Name: "H100", TotalBytes: 80 * gib, UsedBytes: 2 * gib},
			},
			State: wire.HostReady, Address: "10.0.0.12:51234", Version: "0.3.0", ChargedBytes: 62 * gib,
			LastSeen: at(testNow.Add(-3 * time.Second)), CertExpiresAt: at(testNow.Add(16 * time.Hour)),
		}, Instances: []wire.HostInstance{
			{Deployment: "qwen", InstanceID: "qwen/0", State: "ready", Since: testNow.Add(-90 * time.Minute),
				Charges: map[string]int64{"system": 2 * gib, "gpu0": 60 * gib}},
			{Deployment: "llama", InstanceID: "llama/0", State: "parked", Since: testNow.Add(-5 * time.Minute)},
		}},
		"gpu-c": {Host: wire.Host{
			Name: "gpu-c", Online: false, Role: "host",
			State: wire.HostLost, Address: "10.0.0.13:40100", Version: "0.3.0",
			LastSeen: at(testNow.Add(-25 * time.Hour)), CertExpiresAt: at(testNow.Add(-10 * time.Minute)),
		}},
	}}
}

// standaloneHosts is what a standalone role lists: itself, without the
// figures only a server keeps.
func standaloneHosts() []wire.Host {
	return []wire.Host{{
		Name: "gpu-a", Online: true, Role: "standalone", Engines: []string{"llamacpp"},
		GPUs: []wire.GPU{{Index: 0, Name: "GB10", TotalBytes: 119 << 30, Unified: true}},
	}}
}

// mgmtServer serves the real management handler for a backend and records
// every request; it writes the run info and credentials a command finds
// the role with, and returns the state directory.
func mgmtServer(t *testing.T, b *api.Backend) (stateDir string, calls func() []request) {
	t.Helper()
	var mu sync.Mutex
	var seen []request
	h := api.NewManagementHandler(b, testAdminToken)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		mu.Lock()
		seen = append(seen, request{r.Method, r.URL.EscapedPath(), string(body)})
		mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(runinfo.RunInfoFile)), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := runinfo.WriteCredentials(dir, &runinfo.Credentials{APIKey: "k", AdminToken: testAdminToken}); err != nil {
		t.Fatal(err)
	}
	if err := runinfo.WriteRunInfo(dir, runinfo.RunInfo{Role: "test", Management: srv.URL}); err != nil {
		t.Fatal(err)
	}
	return dir, func() []request {
		mu.Lock()
		defer mu.Unlock()
		out := seen
		seen = nil
		return out
	}
}

// runCLI runs capyctl with a fixed clock against a state directory.
func runCLI(t *testing.T, stateDir string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	m := &Meta{Out: &out, Err: &errOut, In: strings.NewReader(""), Getenv: func(string) string { return "" },
		Now: func() time.Time { return testNow }}
	code = RunWith(m, append(args, "--state-dir", stateDir))
	return out.String(), errOut.String(), code
}

// tableRows splits a table printed by Meta.Table into cells (columns are
// at least two spaces apart; a cell may hold one space).
func tableRows(out string) [][]string {
	var rows [][]string
	sep := regexp.MustCompile(` {2,}`)
	for _, l := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		rows = append(rows, sep.Split(strings.TrimRight(l, " "), -1))
	}
	return rows
}

func TestHostCommands_Standalone(t *testing.T) {
	// Fleet stays nil, as a standalone role's backend has it.
	dir, calls := mgmtServer(t, &api.Backend{Hosts: standaloneHosts})

	t.Run("fleet commands are unsupported", func(t *testing.T) {
		for _, args := range [][]string{
			{"create", "join-token"}, {"create", "join-token", "--ttl", "15m", "--host", "gpu-a"},
			{"drain", "host", "gpu-a"}, {"drain", "host", "gpu-a", "--resume"}, {"remove", "host", "gpu-a"},
		} {
			out, errOut, code := runCLI(t, dir, args...)
			if code != 5 || out != "" || !strings.HasPrefix(errOut, "error [unsupported]: ") || !strings.Contains(errOut, "capyctl start server") {
				t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, out, errOut)
			}
			_, errOut, code = runCLI(t, dir, append(args, "--json")...)
			var e struct {
				Error struct{ Code string } `json:"error"`
			}
			if code != 5 || json.Unmarshal([]byte(errOut), &e) != nil || e.Error.Code != "unsupported" {
				t.Errorf("%v --json: exit %d, stderr %q", args, code, errOut)
			}
		}
		calls()
	})

	t.Run("list hosts leaves the server's columns empty", func(t *testing.T) {
		out, errOut, code := runCLI(t, dir, "list", "hosts")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		want := [][]string{
			{"NAME", "ROLE", "ONLINE", "STATE", "ADDRESS", "CARDS", "CHARGED", "LAST SEEN", "CERT EXPIRES", "ENGINES"},
			{"gpu-a", "standalone", "yes", "-", "-", "GB10 119GiB", "-", "-", "-", "llamacpp"},
		}
		if got := tableRows(out); !reflect.DeepEqual(got, want) {
			t.Fatalf("list hosts:\n%s\ngot  %q\nwant %q", out, got, want)
		}
		if c := calls(); len(c) != 1 || c[0].Method != http.MethodGet || c[0].Path != "/management/v1/hosts" {
			t.Fatalf("requests: %+v", c)
		}
	})

	t.Run("status host shows the role itself", func(t *testing.T) {
		out, errOut, code := runCLI(t, dir, "status", "host", "gpu-a")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		for _, line := range []string{"Name:          gpu-a\n", "Role:          standalone\n", "State:         -\n", "Address:       -\n",
			"Last seen:     -\n", "Cert expires:  -\n", "capyctl status lists this role's deployments"} {
			if !strings.Contains(out, line) {
				t.Errorf("status host: no %q in\n%s", line, out)
			}
		}
		_, errOut, code = runCLI(t, dir, "status", "host", "gpu-z")
		if code != 2 || !strings.HasPrefix(errOut, "error [not_found]: ") {
			t.Fatalf("status host gpu-z: exit %d, %s", code, errOut)
		}
	})
}

func TestHostCommands_Server(t *testing.T) {
	fleet := newFleet()
	dir, calls := mgmtServer(t, &api.Backend{Hosts: fleet.list, Fleet: fleet})

	t.Run("list hosts", func(t *testing.T) {
		out, errOut, code := runCLI(t, dir, "list", "hosts")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		want := [][]string{
			{"NAME", "ROLE", "ONLINE", "STATE", "ADDRESS", "CARDS", "CHARGED", "LAST SEEN", "CERT EXPIRES", "ENGINES"},
			{"gpu-b", "host", "yes", "ready", "10.0.0.12:51234", "2x H100 80GiB", "62GiB", "3s ago", "in 16h", "vllm,sglang"},
			{"gpu-c", "host", "no", "lost", "10.0.0.13:40100", "-", "0B", "25h ago", "expired 10m ago", "-"},
		}
		if got := tableRows(out); !reflect.DeepEqual(got, want) {
			t.Fatalf("list hosts:\n%s\ngot  %q\nwant %q", out, got, want)
		}
		out, _, code = runCLI(t, dir, "list", "hosts", "--json")
		var hosts []wire.Host
		if code != 0 || json.Unmarshal([]byte(out), &hosts) != nil || len(hosts) != 2 || hosts[0].Address != "10.0.0.12:51234" ||
			hosts[1].CertExpiresAt == nil || !hosts[1].CertExpiresAt.Equal(testNow.Add(-10*time.Minute)) {
			t.Fatalf("list hosts --json: exit %d %s", code, out)
		}
		calls()
	})

	t.Run("status host", func(t *testing.T) {
		out, errOut, code := runCLI(t, dir, "status", "host", "gpu-b")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		head, rest, _ := strings.Cut(out, "\n\n")
		wantHead := `Name:          gpu-b
Role:          host
State:         ready (takes new placements)
Online:        yes
Address:       10.0.0.12:51234
Version:       0.3.0
Charged:       62GiB
Last seen:     3s ago (2026-12-02T09:59:57Z)
Cert expires:  in 16h (2026-12-03T02:00:00Z)
Engines:       vllm, sglang`
		if head != wantHead {
			t.Fatalf("status host summary:\n%s\nwant\n%s", head, wantHead)
		}
		cards, instances, _ := strings.Cut(rest, "\n\n")
		wantCards := [][]string{
			{"CARD", "NAME", "MEMORY", "USED", "UUID"},
			{"0", "H100", "80GiB", "60GiB", "GPU-aa"},
			{"1", "H100", "80GiB", "2GiB", "GPU-bb"},
		}
		if got := tableRows(cards); !reflect.DeepEqual(got, wantCards) {
			t.Fatalf("cards:\n%s\ngot %q", cards, got)
		}
		wantInstances := [][]string{
			{"INSTANCE", "DEPLOYMENT", "STATE", "CHARGED", "SINCE"},
			{"qwen/0", "qwen", "ready", "gpu0=60GiB system=2GiB", "1h30m ago"},
			{"llama/0", "llama", "parked", "-", "5m ago"},
		}
		if got := tableRows(instances); !reflect.DeepEqual(got, wantInstances) {
			t.Fatalf("instances:\n%s\ngot %q", instances, got)
		}
		if c := calls(); len(c) != 1 || c[0].Method != http.MethodGet || c[0].Path != "/management/v1/hosts/gpu-b" {
			t.Fatalf("requests: %+v", c)
		}

		out, _, code = runCLI(t, dir, "status", "host", "gpu-b", "--json")
		var hd wire.HostDetail
		if code != 0 || json.Unmarshal([]byte(out), &hd) != nil || hd.Name != "gpu-b" || len(hd.Instances) != 2 || hd.APIVersion != wire.APIVersion {
			t.Fatalf("status host --json: exit %d %s", code, out)
		}
		_, errOut, code = runCLI(t, dir, "status", "host", "gpu-z")
		if code != 2 || !strings.HasPrefix(errOut, "error [not_found]: no host gpu-z") {
			t.Fatalf("status host gpu-z: exit %d, %s", code, errOut)
		}
		calls()
	})

	t.Run("create join-token", func(t *testing.T) {
		out, errOut, code := runCLI(t, dir, "create", "join-token", "--ttl", "15m", "--host", "gpu-d")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		want := `Join token (shown once; the server keeps only its digest):

  capyjoin1.3f9a0c.s3cr3t

Expires:         2026-12-02T10:15:00Z (in 15m)
CA fingerprint:  3f9a0c
Joins:           gpu-d only, once
Cluster address: 10.0.0.1:7444

On the host, put the token in a file only its user reads (umask 077; cat > FILE), and run:

  capyctl start host --server 10.0.0.1:7444 --join-token-file FILE

Or give it in CAPYCTL_JOIN_TOKEN (the systemd units read it from an owner-only environment file).
`
		if out != want {
			t.Fatalf("create join-token:\n%s\nwant\n%s", out, want)
		}
		// The token is printed once, for the operator to keep; the command
		// suggested never carries it (L6).
		if strings.Count(out, "capyjoin1.3f9a0c.s3cr3t") != 1 {
			t.Fatalf("the token appears %d times: a suggested command carries it\n%s", strings.Count(out, "capyjoin1.3f9a0c.s3cr3t"), out)
		}
		c := calls()
		if len(c) != 1 || c[0].Method != http.MethodPost || c[0].Path != "/management/v1/join-tokens" ||
			c[0].Body != `{"ttl":"15m","host_name":"gpu-d"}` {
			t.Fatalf("requests: %+v", c)
		}

		// No options: an empty request, so the server's default applies.
		out, _, code = runCLI(t, dir, "create", "join-token", "--json")
		var tok wire.JoinToken
		if code != 0 || json.Unmarshal([]byte(out), &tok) != nil || tok.Token != "capyjoin1.3f9a0c.s3cr3t" || tok.HostName != "" {
			t.Fatalf("create join-token --json: exit %d %s", code, out)
		}
		if c := calls(); len(c) != 1 || c[0].Body != `{}` {
			t.Fatalf("requests: %+v", c)
		}
		if want := []tokenCall{{"gpu-d", 15 * time.Minute}, {"", api.DefaultJoinTokenTTL}}; !reflect.DeepEqual(fleet.tokenCalls(), want) {
			t.Fatalf("the fleet made %+v, want %+v", fleet.tokenCalls(), want)
		}

		// The server owns the TTL's rule.
		_, errOut, code = runCLI(t, dir, "create", "join-token", "--ttl", "soon")
		if code != 2 || !strings.HasPrefix(errOut, "error [invalid_request]: ttl \"soon\"") || len(fleet.tokenCalls()) != 2 {
			t.Fatalf("--ttl soon: exit %d, %s", code, errOut)
		}
		calls()
	})

	t.Run("drain host", func(t *testing.T) {
		out, errOut, code := runCLI(t, dir, "drain", "host", "gpu-b")
		if code != 0 || out != "Host gpu-b draining: no new placements; its 2 instance(s) stay (state draining)\nResume with: capyctl drain host gpu-b --resume\n" {
			t.Fatalf("drain host: exit %d\n%s%s", code, out, errOut)
		}
		if c := calls(); len(c) != 1 || c[0].Method != http.MethodPost || c[0].Path != "/management/v1/hosts/gpu-b/actions" || c[0].Body != `{"action":"drain"}` {
			t.Fatalf("requests: %+v", c)
		}
		out, _, _ = runCLI(t, dir, "list", "hosts")
		if rows := tableRows(out); rows[1][0] != "gpu-b" || rows[1][3] != "draining" {
			t.Fatalf("list hosts after the drain:\n%s", out)
		}
		out, _, _ = runCLI(t, dir, "status", "host", "gpu-b")
		if !strings.Contains(out, "State:         draining (no new placements; running instances stay)\n") ||
			!strings.Contains(out, "Resume placements with: capyctl drain host gpu-b --resume\n") {
			t.Fatalf("status host after the drain:\n%s", out)
		}
		calls()

		out, errOut, code = runCLI(t, dir, "drain", "host", "gpu-b", "--resume", "--json")
		var hd wire.HostDetail
		if code != 0 || json.Unmarshal([]byte(out), &hd) != nil || hd.State != wire.HostReady {
			t.Fatalf("drain host --resume --json: exit %d\n%s%s", code, out, errOut)
		}
		if c := calls(); len(c) != 1 || c[0].Body != `{"action":"resume"}` {
			t.Fatalf("requests: %+v", c)
		}
		_, errOut, code = runCLI(t, dir, "drain", "host", "gpu-z")
		if code != 2 || !strings.HasPrefix(errOut, "error [not_found]: no host gpu-z") {
			t.Fatalf("drain host gpu-z: exit %d, %s", code, errOut)
		}
		calls()
	})

	t.Run("remove host", func(t *testing.T) {
		// A refusal keeps its code and exit status through the API.
		fleet.setFail(structs.Errf(structs.CodeHostUnreachable, "host gpu-c is not connected"))
		_, errOut, code := runCLI(t, dir, "remove", "host", "gpu-c")
		if code != 4 || errOut != "error [host_unreachable]: host gpu-c is not connected\n" {
			t.Fatalf("remove host (unreachable): exit %d, %s", code, errOut)
		}
		fleet.setFail(structs.Errf(structs.CodeHostDraining, "host gpu-c is draining"))
		_, errOut, code = runCLI(t, dir, "remove", "host", "gpu-c", "--json")
		if code != 4 || !strings.Contains(errOut, `"code":"host_draining"`) {
			t.Fatalf("remove host (draining): exit %d, %s", code, errOut)
		}
		fleet.setFail(nil)
		calls()

		out, errOut, code := runCLI(t, dir, "remove", "host", "gpu-b")
		if code != 0 || out != "Host gpu-b removed: its certificate is revoked and its link closed\nIt joins again only with a new token: capyctl create join-token\n" {
			t.Fatalf("remove host: exit %d\n%s%s", code, out, errOut)
		}
		if c := calls(); len(c) != 1 || c[0].Method != http.MethodDelete || c[0].Path != "/management/v1/hosts/gpu-b" || c[0].Body != "" {
			t.Fatalf("requests: %+v", c)
		}
		_, errOut, code = runCLI(t, dir, "status", "host", "gpu-b")
		if code != 2 || !strings.Contains(errOut, "not_found") {
			t.Fatalf("status host after remove: exit %d, %s", code, errOut)
		}
		out, _, code = runCLI(t, dir, "remove", "host", "gpu-c", "--json")
		if code != 0 || out != `{"removed":"gpu-c"}`+"\n" {
			t.Fatalf("remove host --json: exit %d %q", code, out)
		}
	})
}

func TestHostCommands_Usage(t *testing.T) {
	// No request is sent for a usage error: the state directory has no
	// role, which would answer role_not_running (exit 22) instead.
	dir := t.TempDir()
	for _, args := range [][]string{
		{"status", "host"}, {"status", "host", "a", "b"}, {"drain", "host"}, {"drain", "host", "--resume"},
		{"remove", "host"}, {"remove", "host", "a", "b"}, {"create", "join-token", "extra"},
		{"create", "join-token", "--ttl"}, {"drain", "host", "a", "--nope"},
	} {
		_, errOut, code := runCLI(t, dir, args...)
		if code != 2 || !strings.HasPrefix(errOut, "error [invalid_request]: ") {
			t.Errorf("%v: exit %d, %s", args, code, errOut)
		}
	}
	for _, args := range [][]string{{"status", "host", "a"}, {"drain", "host", "a"}, {"remove", "host", "a"}, {"create", "join-token"}} {
		_, errOut, code := runCLI(t, dir, args...)
		if code != 22 || !strings.HasPrefix(errOut, "error [role_not_running]: ") {
			t.Errorf("%v without a role: exit %d, %s", args, code, errOut)
		}
	}
}

func TestDialAddress(t *testing.T) {
	cases := []struct {
		name, in, want string
		note           bool
	}{
		{"an address", "10.0.0.1:7444", "10.0.0.1:7444", false},
		{"a name", "capy.example:7444", "capy.example:7444", false},
		{"IPv6", "[fd00::1]:7444", "[fd00::1]:7444", false},
		{"every IPv4 address", "0.0.0.0:7444", "<server address>:7444", true},
		{"every IPv6 address", "[::]:7444", "<server address>:7444", true},
		{"no host", ":7444", "<server address>:7444", true},
		{"none reported", "", "<server address>", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, note := dialAddress(c.in)
			if got != c.want || (note != "") != c.note {
				t.Fatalf("dialAddress(%q) = %q, %q", c.in, got, note)
			}
		})
	}
}

func TestShortDuration(t *testing.T) {
	cases := []struct {
		name string
		in   time.Duration
		want string
	}{
		{"zero", 0, "0s"},
		{"seconds", 45 * time.Second, "45s"},
		{"rounds up to a minute", 59*time.Second + 600*time.Millisecond, "1m"},
		{"minutes", 12*time.Minute + 20*time.Second, "12m"},
		{"rounds up to an hour", 59*time.Minute + 40*time.Second, "1h"},
		{"hours and minutes", 3*time.Hour + 20*time.Minute, "3h20m"},
		{"up to two days in hours", 47 * time.Hour, "47h"},
		{"days and hours", 52 * time.Hour, "2d4h"},
		{"whole days", 72 * time.Hour, "3d"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := shortDuration(c.in); got != c.want {
				t.Fatalf("shortDuration(%v) = %q, want %q", c.in, got, c.want)
			}
		})
	}
}
