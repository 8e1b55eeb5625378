// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"

	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/api"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/apikeys"
	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/fleet/hostagent"
	"github.com/capyctl/capyctl/core/hostlink"
	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// fakeLocal is a host's side without engines: one card, no instances, and
// a relay handler that answers a chat stream until the request ends.
type fakeLocal struct {
	mu        sync.Mutex
	journals  []*hostv1.InstanceJournal
	cancelled atomic.Int64 // streams whose request context ended early
	answered  atomic.Int64 // non-streamed requests answered
	// types are the Content-Type headers of the requests relayed.
	types   []string
	started chan struct{}
	changes signal
	// desired is every share applied, in order; refuse answers each
	// engine of a share with its code, refuseDeps each deployment.
	desired    []*hostv1.Desired
	refuse     structs.Code
	refuseDeps structs.Code
	refuseAt   []bool // per share of desired: its deployments were refused
	applied    signal
}

// Commands implements Local: a host of no engines refuses every command.
func (l *fakeLocal) Commands() hostlink.Handler { return refuseCommands{} }

// refuseCommands refuses every command.
type refuseCommands struct{}

func (refuseCommands) StartInstance(context.Context, *hostv1.StartInstance) error {
	return errNoEngines
}
func (refuseCommands) ParkInstance(context.Context, *hostv1.ParkInstance) error { return errNoEngines }
func (refuseCommands) WakeInstance(context.Context, *hostv1.WakeInstance) error { return errNoEngines }
func (refuseCommands) StopInstance(context.Context, *hostv1.StopInstance) error { return errNoEngines }
func (refuseCommands) AbortRequest(context.Context, *hostv1.AbortRequest) error { return errNoEngines }
func (refuseCommands) DeploymentAction(context.Context, *hostv1.DeploymentAction) error {
	return errNoEngines
}

var errNoEngines = structs.Errf(structs.CodeNotFound, "this host runs no engines")

// Changed implements Local.
func (l *fakeLocal) Changed() <-chan struct{} { return l.changes.changed() }

// ApplyDesired implements Local: it records the share and refuses each
// engine with l.refuse, each deployment with l.refuseDeps, when set.
func (l *fakeLocal) ApplyDesired(_ context.Context, d *hostv1.Desired) []*hostv1.DesiredResult {
	l.mu.Lock()
	l.desired = append(l.desired, d)
	refuse, refuseDeps := l.refuse, l.refuseDeps
	l.refuseAt = append(l.refuseAt, refuseDeps != "")
	l.mu.Unlock()
	defer l.applied.publish()
	var out []*hostv1.DesiredResult
	if refuse != "" {
		for _, e := range d.GetEngines() {
			out = append(out, &hostv1.DesiredResult{Kind: "engine", Name: e.GetName(), Code: string(refuse), Message: "refused here"})
		}
	}
	if refuseDeps != "" {
		for _, dep := range d.GetDeployments() {
			out = append(out, &hostv1.DesiredResult{Kind: "deployment", Name: dep.GetName(), Code: string(refuseDeps), Message: "refused here"})
		}
	}
	return out
}

// lastDesired is the last share applied (nil: none yet).
func (l *fakeLocal) lastDesired() *hostv1.Desired {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.desired) == 0 {
		return nil
	}
	return l.desired[len(l.desired)-1]
}

func newFakeLocal() *fakeLocal { return &fakeLocal{started: make(chan struct{}, 64)} }

func (l *fakeLocal) Inventory() *hostv1.Inventory {
	return &hostv1.Inventory{Cards: []*hostv1.Card{{Uuid: "GPU-test", Name: "Test", MemoryBytes: 24 << 30}}, HostMemoryBytes: 64 << 30}
}

func (l *fakeLocal) Readings() []*hostv1.LedgerReading {
	return []*hostv1.LedgerReading{{Domain: "gpu0", DeviceUuid: "GPU-test", CapacityBytes: 24 << 30, RoomBytes: 22 << 30}}
}

func (l *fakeLocal) Journals() []*hostv1.InstanceJournal {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*hostv1.InstanceJournal(nil), l.journals...)
}

// Events forwards nothing: a host without events.
func (l *fakeLocal) Events(cursor uint64, _ int) ([]*hostv1.Event, uint64) { return nil, cursor }

// RelayHandler answers /v1/chat/completions: non-streamed "ok", or, with
// ?stream, one SSE chunk every 10 ms until 200 are sent or the request
// ends (a hang-up at the server).
func (l *fakeLocal) RelayHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" || r.Header.Get("X-Api-Key") != "" {
			http.Error(w, "the relay must not carry the client's credentials", http.StatusBadRequest)
			return
		}
		body, _ := io.ReadAll(r.Body)
		l.mu.Lock()
		l.types = append(l.types, r.Header.Get("Content-Type"))
		l.mu.Unlock()
		if !strings.Contains(string(body), `"stream":true`) {
			l.answered.Add(1)
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"object":"chat.completion","echo":%d}`, len(body))
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		l.started <- struct{}{}
		for i := 0; i < 200; i++ {
			select {
			case <-r.Context().Done():
				l.cancelled.Add(1)
				return
			case <-time.After(10 * time.Millisecond):
			}
			fmt.Fprintf(w, "data: {\"i\":%d}\n\n", i)
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
}

// testServer runs a fleet server on loopback with a fresh store.
func testServer(t testing.TB, o ServerOptions) *Server {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "capyctl.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	o.StateDir, o.Listen, o.Store = dir, "127.0.0.1:0", st
	return startTestServer(t, o)
}

// startTestServer starts a server of o (a cluster of one voter unless o
// joins one) and waits until it knows its leader.
func startTestServer(t testing.TB, o ServerOptions) *Server {
	t.Helper()
	return startTestServerWith(t, o, nil)
}

// startTestServerWith is startTestServer with a hook on the server made
// and not yet started (a fake of its hosts, grouphosts_test.go).
func startTestServerWith(t testing.TB, o ServerOptions, before func(*Server)) *Server {
	t.Helper()
	if o.Heartbeat == 0 {
		o.Heartbeat = 100 * time.Millisecond
	}
	if o.Name == "" {
		o.Name = "server-test"
	}
	s, err := NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	if before != nil {
		before(s)
	}
	s.Start()
	t.Cleanup(func() { s.Close(); o.Store.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.JoinCluster(ctx); err != nil {
		t.Fatal(err)
	}
	if o.Join == "" {
		poll.Until(t, 10*time.Second, "the server leads", func() bool { return s.leaderOnly() == nil })
	}
	return s
}

// joinHost joins a host named name with a fresh token and runs it until
// the test ends.
func joinHost(t testing.TB, s *Server, name string, local hostagent.Local) *hostagent.Host {
	t.Helper()
	tok, err := s.NewJoinToken("", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	h, err := hostagent.NewHost(context.Background(), hostagent.HostOptions{StateDir: t.TempDir(), Server: s.Addr(), JoinToken: tok.Token, Name: name, Local: local})
	if err != nil {
		t.Fatalf("join %s: %v", name, err)
	}
	runHost(t, h)
	return h
}

func runHost(t testing.TB, h *hostagent.Host) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
	t.Cleanup(stop)
	return stop
}

func hostState(s *Server, name string) string {
	for _, h := range s.Hosts() {
		if h.Name == name {
			return h.State
		}
	}
	return ""
}

// waitReady waits until the server sees host name ready (link and relay
// up).
func waitReady(t *testing.T, s *Server, name string) {
	t.Helper()
	poll.Until(t, 10*time.Second, name+" ready", func() bool { return hostState(s, name) == wire.HostReady })
}

func TestJoin_Refusals(t *testing.T) {
	s := testServer(t, ServerOptions{})
	other := testServer(t, ServerOptions{})

	// A token redeemed once is refused the second time, and an expired
	// one is refused.
	tok, _ := s.NewJoinToken("", time.Minute)
	if _, err := hostagent.NewHost(context.Background(), hostagent.HostOptions{StateDir: t.TempDir(), Server: s.Addr(), JoinToken: tok.Token, Name: "a", Local: newFakeLocal()}); err != nil {
		t.Fatal(err)
	}
	_, err := hostagent.NewHost(context.Background(), hostagent.HostOptions{StateDir: t.TempDir(), Server: s.Addr(), JoinToken: tok.Token, Name: "b", Local: newFakeLocal()})
	if !structs.HasCode(err, structs.CodeJoinTokenUsed) {
		t.Fatalf("a reused token: %v, want join_token_used", err)
	}
	short, _ := s.NewJoinToken("", 50*time.Millisecond)
	time.Sleep(100 * time.Millisecond)
	_, err = hostagent.NewHost(context.Background(), hostagent.HostOptions{StateDir: t.TempDir(), Server: s.Addr(), JoinToken: short.Token, Name: "c", Local: newFakeLocal()})
	if !structs.HasCode(err, structs.CodeJoinTokenExpired) {
		t.Fatalf("an expired token: %v, want join_token_expired", err)
	}
	// A token of another server's CA: the host refuses the server before
	// it sends the token.
	foreign, _ := other.NewJoinToken("", time.Minute)
	_, err = hostagent.NewHost(context.Background(), hostagent.HostOptions{StateDir: t.TempDir(), Server: s.Addr(), JoinToken: foreign.Token, Name: "d", Local: newFakeLocal()})
	if !structs.HasCode(err, structs.CodeJoinCAMismatch) {
		t.Fatalf("another CA's token: %v, want join_ca_mismatch", err)
	}
	// A token for one host name does not join another.
	named, _ := s.NewJoinToken("gpu-x", time.Minute)
	_, err = hostagent.NewHost(context.Background(), hostagent.HostOptions{StateDir: t.TempDir(), Server: s.Addr(), JoinToken: named.Token, Name: "gpu-y", Local: newFakeLocal()})
	if !structs.HasCode(err, structs.CodeHostNameChanged) {
		t.Fatalf("a token for gpu-x used by gpu-y: %v, want host_name_changed", err)
	}
	// No token and no certificate.
	_, err = hostagent.NewHost(context.Background(), hostagent.HostOptions{StateDir: t.TempDir(), Server: s.Addr(), Name: "e", Local: newFakeLocal()})
	if !structs.HasCode(err, structs.CodeJoinTokenInvalid) {
		t.Fatalf("no token: %v, want join_token_invalid", err)
	}
}

// handshakeRefused reports whether the server refuses a mutual TLS
// conversation (TLS 1.3 reports a refused client certificate on the first
// read).
func handshakeRefused(t *testing.T, addr string, cfg *tls.Config) bool {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return true
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Read(make([]byte, 1))
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false // the server took the connection and waits for us
	}
	return err != nil
}

func TestCluster_RefusesWhatItShould(t *testing.T) {
	s := testServer(t, ServerOptions{HostCertLifetime: 2 * time.Second})
	other := testServer(t, ServerOptions{})
	local := newFakeLocal()
	h := joinHost(t, s, "gpu-a", local)
	waitReady(t, s, "gpu-a")

	// The host's own certificate is taken (a relay conversation).
	if handshakeRefused(t, s.Addr(), h.TLSFor(s.Addr(), ALPNRelay)) {
		t.Fatal("the host's valid certificate was refused")
	}
	// No certificate.
	noCert := h.TLSFor(s.Addr(), ALPNRelay)
	noCert.GetClientCertificate = nil
	if !handshakeRefused(t, s.Addr(), noCert) {
		t.Fatal("a connection without a client certificate was taken")
	}
	// A certificate of another server's CA.
	stranger := joinHost(t, other, "gpu-a", newFakeLocal())
	foreign := stranger.TLSFor(s.Addr(), ALPNRelay)
	foreign.RootCAs = h.TLSFor(s.Addr(), ALPNRelay).RootCAs // trust s, present other's certificate
	if !handshakeRefused(t, s.Addr(), foreign) {
		t.Fatal("a certificate of another CA was taken")
	}
	// An expired certificate: keep a copy of the current one and wait past
	// its expiry (the running host renews its own meanwhile).
	old := *h.Certificate()
	expired := h.TLSFor(s.Addr(), ALPNRelay)
	expired.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &old, nil }
	time.Sleep(time.Until(old.Leaf.NotAfter) + 100*time.Millisecond)
	if !handshakeRefused(t, s.Addr(), expired) {
		t.Fatal("an expired certificate was taken")
	}
	// The host renewed by itself before expiry: its link is still up with
	// a later certificate.
	if !h.CertExpiry().After(old.Leaf.NotAfter) {
		t.Fatalf("the host did not renew: expiry %s, old %s", h.CertExpiry(), old.Leaf.NotAfter)
	}
	waitReady(t, s, "gpu-a")

	// A removed host is refused at once, on the connections it holds and
	// on every new one.
	if err := s.Remove("gpu-a"); err != nil {
		t.Fatal(err)
	}
	if !handshakeRefused(t, s.Addr(), h.TLSFor(s.Addr(), ALPNRelay)) {
		t.Fatal("a removed host's certificate was taken")
	}
	if got := hostState(s, "gpu-a"); got != "" {
		t.Fatalf("removed host still listed: %s", got)
	}
}

func TestLink_HostNameChanged(t *testing.T) {
	s := testServer(t, ServerOptions{})
	dir := t.TempDir()
	tok, _ := s.NewJoinToken("", time.Minute)
	h, err := hostagent.NewHost(context.Background(), hostagent.HostOptions{StateDir: dir, Server: s.Addr(), JoinToken: tok.Token, Name: "gpu-a", Local: newFakeLocal()})
	if err != nil {
		t.Fatal(err)
	}
	// The same state under another name is refused on the host itself...
	_, err = hostagent.NewHost(context.Background(), hostagent.HostOptions{StateDir: dir, Server: s.Addr(), Name: "gpu-b", Local: newFakeLocal()})
	if !structs.HasCode(err, structs.CodeHostNameChanged) {
		t.Fatalf("restart under another name: %v, want host_name_changed", err)
	}
	// ...and a Hello that names another host than the certificate is
	// refused by the server, which ends the host's Run.
	h.Rename("gpu-b")
	done := make(chan error, 1)
	go func() { done <- h.Run(context.Background()) }()
	select {
	case err := <-done:
		if !structs.HasCode(err, structs.CodeHostNameChanged) {
			t.Fatalf("Run: %v, want host_name_changed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not refuse a Hello under another name")
	}
}

func TestRelay_StreamsAndCancelsOnHangUp(t *testing.T) {
	s := testServer(t, ServerOptions{})
	local := newFakeLocal()
	joinHost(t, s, "gpu-a", local)
	waitReady(t, s, "gpu-a")
	if err := s.apply(fsm.Placed{Placement: &Placement{Deployment: "demo", Routes: []string{"demo", "chat"},
		Hosts: []HostShare{{Host: "gpu-a", Instances: 1}}}}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.InferenceHandler(apikeys.RoleOnly("key"), api.AuthOptions{}, 0, 0))
	defer srv.Close()
	post := func(ctx context.Context, body string) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer key")
		req.Header.Set("Content-Type", "application/json")
		return http.DefaultClient.Do(req)
	}

	// Non-streamed, by a route name.
	resp, err := post(context.Background(), `{"model":"chat","messages":[]}`)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"echo":`) {
		t.Fatalf("relayed answer: %d %s", resp.StatusCode, b)
	}
	// Anthropic's x-api-key authenticates too, and is not relayed either.
	areq, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/messages", strings.NewReader(`{"model":"chat","max_tokens":1,"messages":[]}`))
	areq.Header.Set("X-Api-Key", "key")
	areq.Header.Set("Content-Type", "application/json")
	resp, err = http.DefaultClient.Do(areq)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a request with x-api-key: %d %s", resp.StatusCode, b)
	}
	// Unknown model: the server answers it, coded.
	resp, _ = post(context.Background(), `{"model":"nope"}`)
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(b), "unknown_model") {
		t.Fatalf("unknown model: %d %s", resp.StatusCode, b)
	}

	// A stream arrives chunk by chunk; the client hangs up after three
	// chunks and the host's handler sees its request end.
	ctx, cancel := context.WithCancel(context.Background())
	resp, err = post(ctx, `{"model":"demo","stream":true}`)
	if err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(resp.Body)
	for n := 0; n < 3; {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("stream: %v", err)
		}
		if strings.HasPrefix(line, "data: ") {
			n++
		}
	}
	cancel()
	resp.Body.Close()
	poll.Until(t, 5*time.Second, "the host's handler sees the hang-up", func() bool { return local.cancelled.Load() == 1 })
	// The stream, taken over from net/http, is no longer counted: a
	// stopping server's drain does not wait for it.
	dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
	s.DrainStreams(dctx)
	if dctx.Err() != nil {
		t.Fatal("the drain waited for a stream that had ended")
	}
	dcancel()

	// The host goes away: a request fails fast with a coded 503 and
	// Retry-After.
	stop := runHostStop(s, "gpu-a")
	stop()
	poll.Until(t, 5*time.Second, "gpu-a lost", func() bool { return hostState(s, "gpu-a") == wire.HostLost })
	resp, _ = post(context.Background(), `{"model":"demo"}`)
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(b), "host_unreachable") {
		t.Fatalf("request for a lost host's model: %d %v %s", resp.StatusCode, resp.Header, b)
	}
}

// runHostStop closes a host's link and relay from the server's side and
// keeps them closed by revoking nothing: it ends the host's connections
// the way a dead host agent does (the test's host keeps dialling, so the
// server's listener is closed for it).
func runHostStop(s *Server, name string) func() {
	return func() {
		s.mu.Lock()
		h := s.hosts[name]
		s.mu.Unlock()
		s.ln.Close() // no reconnect: the host looks gone
		if h != nil && h.linkCancel != nil {
			h.linkCancel()
		}
	}
}

func TestJoin_AMemberNameNeedsItsOwnToken(t *testing.T) {
	s := testServer(t, ServerOptions{})
	joinHost(t, s, "gpu-a", newFakeLocal())
	waitReady(t, s, "gpu-a")
	// Another machine with any host's token cannot take gpu-a's name...
	tok, _ := s.NewJoinToken("", time.Minute)
	_, err := hostagent.NewHost(context.Background(), hostagent.HostOptions{StateDir: t.TempDir(), Server: s.Addr(), JoinToken: tok.Token, Name: "gpu-a", Local: newFakeLocal()})
	if !structs.HasCode(err, structs.CodeConflict) {
		t.Fatalf("an unbound token for a member's name: %v, want conflict", err)
	}
	// ...a token made for gpu-a joins it again.
	bound, _ := s.NewJoinToken("gpu-a", time.Minute)
	if _, err := hostagent.NewHost(context.Background(), hostagent.HostOptions{StateDir: t.TempDir(), Server: s.Addr(), JoinToken: bound.Token, Name: "gpu-a", Local: newFakeLocal()}); err != nil {
		t.Fatalf("a token bound to gpu-a: %v", err)
	}
}

// TestRenew_RefusedForANonMember: a host the replicated state does not
// name renews nowhere: refused at the handshake once removed (its
// certificates revoked on every server), and host_unknown, which the host
// retries, when a restored state does not name it yet.
func TestRenew_RefusedForANonMember(t *testing.T) {
	s := testServer(t, ServerOptions{})
	h := joinHost(t, s, "gpu-a", newFakeLocal())
	waitReady(t, s, "gpu-a")
	if err := h.RenewNow(context.Background()); err != nil {
		t.Fatalf("a member's renewal: %v", err)
	}
	// A state restored from a backup that predates the host.
	if err := s.apply(fsm.Restored{State: []byte(`{"hosts":[],"placements":[]}`)}); err != nil {
		t.Fatal(err)
	}
	if err := h.RenewNow(context.Background()); !structs.HasCode(err, structs.CodeHostUnknown) {
		t.Fatalf("an unknown host's renewal: %v, want host_unknown", err)
	}
	// Known again, then removed: revoked.
	if err := s.apply(fsm.HostJoined{Host: "gpu-a"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove("gpu-a"); err != nil {
		t.Fatal(err)
	}
	if err := h.RenewNow(context.Background()); err == nil || !strings.Contains(err.Error(), "bad certificate") {
		t.Fatalf("a removed host's renewal: %v, want refused at the handshake", err)
	}
}
