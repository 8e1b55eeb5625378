// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/capyctl/capyctl/core/api"
	"github.com/capyctl/capyctl/core/apikeys"
	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/fleet/hostagent"
	"github.com/capyctl/capyctl/core/pki"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/attack"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// joinFrom joins a host named name from the local address src (a
// stranger's address to the server), as a host's join does: the server's
// CA pinned by the token, then POST /join. It returns the server's answer
// status or what failed.
func joinFrom(serverAddr string, src net.IP, token, name string) error {
	tok, err := pki.ParseJoinToken(token)
	if err != nil {
		return err
	}
	key, err := pki.NewKey()
	if err != nil {
		return err
	}
	csr, err := pki.NewCSR(key, name)
	if err != nil {
		return err
	}
	cfg := pki.HostJoinTLS(tok.Fingerprint)
	cfg.NextProtos = []string{ALPNJoin, ALPNHTTP1}
	cfg.ServerName = "127.0.0.1"
	dialer := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: src}}
	tr := &http.Transport{TLSClientConfig: cfg, DialContext: dialer.DialContext, TLSHandshakeTimeout: 5 * time.Second}
	defer tr.CloseIdleConnections()
	body, _ := json.Marshal(JoinRequest{Token: token, CSR: csr})
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Post("https://"+serverAddr+"/join", "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("join answered %d: %s", resp.StatusCode, data)
	}
	return nil
}

// relayedChat sends one chat request through the server's inference
// handler and returns the answer's status and body.
func relayedChat(t *testing.T, url, model string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{"model":"`+model+`","messages":[]}`))
	req.Header.Set("Authorization", "Bearer key")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestClusterListener_IdleFloodCutsNoHostOff (H1): hundreds of idle TCP
// connections to the cluster listener, from one address and from many,
// held open while a joined host's link is cut and comes back, a new host
// joins from the cluster's own address and another from a stranger's
// address, and a relayed request answers. On the release before the gate,
// the flood held every one of the 256 handshake slots for 10 s and each of
// these was refused.
func TestClusterListener_IdleFloodCutsNoHostOff(t *testing.T) {
	s := testServer(t, ServerOptions{})
	joinHost(t, s, "gpu-a", newFakeLocal())
	waitReady(t, s, "gpu-a")
	if err := s.apply(fsm.Placed{Placement: &Placement{Deployment: "demo", Routes: []string{"demo"},
		Hosts: []HostShare{{Host: "gpu-a", Instances: 1}}}}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.InferenceHandler(apikeys.RoleOnly("key"), api.AuthOptions{}, 0, 0))
	defer srv.Close()

	// One address floods with 300, eighty others with 5 each (400 in
	// all, more than every stranger's slot).
	one := attack.OpenFlood(attack.FloodOptions{Target: s.Addr(), PerSource: 300, Sources: attack.Loopback(2, 1)})
	defer one.Close()
	many := attack.OpenFlood(attack.FloodOptions{Target: s.Addr(), PerSource: 5, Sources: attack.Loopback(10, 80)})
	defer many.Close()
	t.Logf("flood: %d+%d connections open; failed: %v %v", one.Opened(), many.Opened(), one.Failed(), many.Failed())
	if one.Opened()+many.Opened() < 300 {
		t.Fatalf("the flood opened %d connections, want hundreds", one.Opened()+many.Opened())
	}

	// An established host's link is cut: it links again through the
	// flood, and its relay comes back.
	// (On a loaded machine the flood may have cut the link already: wait
	// for it to be up, then cut it.)
	var h *liveHost
	var gen uint64
	poll.Until(t, 10*time.Second, "gpu-a linked before the cut", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		h = s.hosts["gpu-a"]
		if h == nil || h.linkCancel == nil {
			return false
		}
		gen = h.linkGen
		h.linkCancel()
		if h.relayConn != nil {
			h.relayConn.Close()
		}
		return true
	})
	poll.Until(t, 10*time.Second, "gpu-a linked again", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return h.linkGen > gen && h.linkCancel != nil && relayUp(h.relay)
	})
	waitReady(t, s, "gpu-a")
	if code, body := relayedChat(t, srv.URL, "demo"); code != http.StatusOK {
		t.Fatalf("a relayed request during the flood: %d %s", code, body)
	}
	// A new host joins (from the cluster's own address) and links.
	joinHost(t, s, "gpu-b", newFakeLocal())
	waitReady(t, s, "gpu-b")
	// A host joins from an address the server never saw: it takes the
	// oldest stranger's slot.
	tok, err := s.NewJoinToken("", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := joinFrom(s.Addr(), net.IPv4(127, 0, 1, 1), tok.Token, "gpu-c"); err != nil {
		t.Fatalf("a stranger's join during the flood: %v", err)
	}
	// The bounds held: one address never holds more than its share, and
	// the strangers' pool never more than its slots.
	strangers, known := s.gate.held()
	if strangers > defaultGateLimits.strangers || known > defaultGateLimits.known {
		t.Fatalf("slots held: %d strangers, %d known; bounds %d and %d", strangers, known, defaultGateLimits.strangers, defaultGateLimits.known)
	}
	s.gate.mu.Lock()
	n := s.gate.perAddr["127.0.0.2"]
	s.gate.mu.Unlock()
	if n > defaultGateLimits.perAddress {
		t.Fatalf("one address holds %d slots, bound %d", n, defaultGateLimits.perAddress)
	}
}

// TestClusterListener_HandshakeDeadline: a connection that never sends
// its ClientHello is closed after the handshake deadline, and its slot
// comes back.
func TestClusterListener_HandshakeDeadline(t *testing.T) {
	s := testServer(t, ServerOptions{})
	f := attack.OpenFlood(attack.FloodOptions{Target: s.Addr(), PerSource: 3, Sources: attack.Loopback(2, 1)})
	defer f.Close()
	poll.Until(t, 10*time.Second, "the idle connections closed by the server", func() bool { return f.ClosedByPeer() == 3 })
	poll.Until(t, 10*time.Second, "their slots back", func() bool { st, kn := s.gate.held(); return st == 0 && kn == 0 })
}

// TestRefusalLog_OnceAnIntervalWithCounts (L5): refused handshakes and
// joins are counted and logged as one line per interval.
func TestRefusalLog_OnceAnIntervalWithCounts(t *testing.T) {
	var buf lockedBuffer
	s := testServer(t, ServerOptions{Logger: hclog.New(&hclog.LoggerOptions{Output: &buf, Level: hclog.Info})})
	s.refused.flush() // what the start may have noted
	for i := 0; i < 50; i++ {
		c, err := tls.Dial("tcp", s.Addr(), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{ALPNRelay}})
		if err == nil {
			_, _ = c.Read(make([]byte, 1)) // TLS 1.3: the refusal of no certificate arrives on the first read
			c.Close()
		}
	}
	tok, err := s.NewJoinToken("", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := joinFrom(s.Addr(), net.IPv4(127, 0, 0, 1), tok.Token, "gpu-x"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		_ = joinFrom(s.Addr(), net.IPv4(127, 0, 0, 1), tok.Token, "gpu-y") // used
	}
	poll.Until(t, 10*time.Second, "the refusals counted", func() bool {
		s.refused.mu.Lock()
		defer s.refused.mu.Unlock()
		return s.refused.counts[refusedHandshake] >= 50 && s.refused.counts["join_refused:join_token_used"] >= 20
	})
	if n := strings.Count(buf.String(), "cluster listener refusals"); n != 0 {
		t.Fatalf("%d refusal lines before the interval ended, want none:\n%s", n, buf.String())
	}
	if n := strings.Count(buf.String(), "join refused"); n != 0 {
		t.Fatalf("%d lines per refused join at info or above:\n%s", n, buf.String())
	}
	s.refused.flush()
	out := buf.String()
	if n := strings.Count(out, "cluster listener refusals"); n != 1 {
		t.Fatalf("%d refusal lines after one interval, want 1:\n%s", n, out)
	}
	for _, want := range []string{"handshake_failed=", "join_refused:join_token_used=", "busiest_address=127.0.0.1"} {
		if !strings.Contains(out, want) {
			t.Fatalf("the refusal line lacks %q:\n%s", want, out)
		}
	}
}

// lockedBuffer is a log's output read while the log writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// addrConn is a connection from a given address (the gate reads only
// that and closes it).
type addrConn struct {
	net.Conn
	from   net.Addr
	closed bool
}

func (c *addrConn) RemoteAddr() net.Addr { return c.from }
func (c *addrConn) Close() error         { c.closed = true; return nil }

func from(ip string) *addrConn {
	return &addrConn{from: &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000}}
}

// TestHandshakeGate_Bounds: one address holds at most its share; strangers
// share their pool and a newcomer closes the oldest; an address a
// certificate was verified from draws on its own pool, which strangers
// never take, and takes nothing from theirs.
func TestHandshakeGate_Bounds(t *testing.T) {
	g := newHandshakeGate(gateLimits{strangers: 4, known: 2, perAddress: 2, perKnownAddress: 2, knownFor: time.Hour})
	var slots []*gateSlot
	for i := 0; i < 2; i++ {
		s, why, _ := g.admit(from("10.0.0.1"))
		if s == nil {
			t.Fatalf("connection %d of an address refused: %s", i+1, why)
		}
		slots = append(slots, s)
	}
	if s, why, _ := g.admit(from("10.0.0.1")); s != nil || why != refusedPerAddress {
		t.Fatalf("a third connection of one address: %v %q, want refused %q", s, why, refusedPerAddress)
	}
	oldest := from("10.0.0.2")
	if s, _, _ := g.admit(oldest); s == nil {
		t.Fatal("a stranger refused below the bound")
	}
	if s, _, _ := g.admit(from("10.0.0.3")); s == nil {
		t.Fatal("a stranger refused at the bound")
	}
	// The pool is full (4): the next stranger closes the oldest (the
	// first of 10.0.0.1), not itself.
	first := slots[0].conn.(*addrConn)
	s, _, evicted := g.admit(from("10.0.0.4"))
	if s == nil || evicted != evictedOldest || !first.closed {
		t.Fatalf("a stranger over the bound: slot %v, evicted %q, oldest closed %v", s, evicted, first.closed)
	}
	if st, _ := g.held(); st != 4 {
		t.Fatalf("%d strangers' slots held, want 4", st)
	}
	// A host's address: verified once, it draws on the known pool and
	// closes no stranger.
	g.verifiedFrom(&net.TCPAddr{IP: net.ParseIP("10.0.0.9")})
	host := from("10.0.0.9")
	s, why, evicted := g.admit(host)
	if s == nil || !s.known || evicted != "" {
		t.Fatalf("a known address with the strangers' pool full: slot %v (%q), evicted %q", s, why, evicted)
	}
	if st, kn := g.held(); st != 4 || kn != 1 {
		t.Fatalf("held %d strangers and %d known, want 4 and 1", st, kn)
	}
	// Released slots come back, once.
	s.release()
	s.release()
	if _, kn := g.held(); kn != 0 {
		t.Fatalf("%d known slots held after release, want 0", kn)
	}
	// An address verified longer ago than knownFor is a stranger again.
	g.now = func() time.Time { return time.Now().Add(2 * time.Hour) }
	if s, _, _ := g.admit(from("10.0.0.9")); s == nil || s.known {
		t.Fatalf("an address verified two hours ago: %+v, want a stranger's slot", s)
	}
}

// handlerLocal is a host without engines whose relay answers with handler.
type handlerLocal struct {
	*fakeLocal
	handler http.Handler
}

func (l handlerLocal) RelayHandler() http.Handler { return l.handler }

// place puts deployment dep, serving route, on host.
func place(t *testing.T, s *Server, dep, host string) {
	t.Helper()
	if err := s.apply(fsm.Placed{Placement: &Placement{Deployment: dep, Routes: []string{dep},
		Hosts: []HostShare{{Host: host, Instances: 1}}}}); err != nil {
		t.Fatal(err)
	}
}

// stalledBody starts a request of declared bytes and sends all but the
// last of them; the connection stays open until the test ends.
func stalledBody(t *testing.T, addr string, declared int) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", declared)
	if _, err := c.Write(bytes.Repeat([]byte(" "), declared-1)); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestRelay_BodiesInFlightBounded (M1): the server holds no more request
// bodies at once than limits.max_body_bytes_in_flight: with two bodies of
// 1 MiB held (bound 2 MiB), a third is refused 429 bodies_in_flight_full
// before a byte of it is read, a small one still passes (the reserve of
// small bodies), and once the held ones end their bytes are back. Before
// the bound, the third was read and relayed.
func TestRelay_BodiesInFlightBounded(t *testing.T) {
	s := testServer(t, ServerOptions{})
	joinHost(t, s, "gpu-a", newFakeLocal())
	waitReady(t, s, "gpu-a")
	place(t, s, "demo", "gpu-a")
	srv := httptest.NewServer(s.InferenceHandler(apikeys.RoleOnly("key"), api.AuthOptions{}, 1<<20, 2<<20))
	t.Cleanup(srv.Close) // after the held connections close
	addr := strings.TrimPrefix(srv.URL, "http://")

	big := `{"model":"demo","messages":[],"pad":"` + strings.Repeat("x", 1<<20-60) + `"}`
	send := func(body string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer key")
		// The body waits for the server's go-ahead: a refusal before
		// the body is read then arrives as an answer, not as a reset
		// while the client still writes.
		req.Header.Set("Expect", "100-continue")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// Two bodies held: a third is refused, not read. (A held body may
	// itself have been refused while a probe's body was still counted: it
	// is sent again.)
	held := []net.Conn{stalledBody(t, addr, len(big)), stalledBody(t, addr, len(big))}
	poll.Until(t, 10*time.Second, "a third large body refused while two are held", func() bool {
		for i, c := range held {
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
			if n, _ := c.Read(make([]byte, 1)); n > 0 {
				c.Close()
				held[i] = stalledBody(t, addr, len(big))
			}
		}
		code, body := send(big)
		return code == http.StatusTooManyRequests && strings.Contains(body, "bodies_in_flight_full")
	})
	if code, body := send(`{"model":"demo","messages":[]}`); code != http.StatusOK {
		t.Fatalf("a small body while large ones are held: %d %s", code, body)
	}
	for _, c := range held {
		c.Close()
	}
	poll.Until(t, 10*time.Second, "a large body taken again once the held ones ended", func() bool {
		code, _ := send(big)
		return code == http.StatusOK
	})
}

// TestRelay_ModelByItsExactName (L1): the server reads the model as the
// host does: {"model":"secret1","Model":"demo"} was placed as demo (Go's
// case-insensitive decoding) and served as secret1 by demo's host; now
// it is refused, as is a model named twice.
func TestRelay_ModelByItsExactName(t *testing.T) {
	s := testServer(t, ServerOptions{})
	seen := make(chan string, 4)
	joinHost(t, s, "gpu-a", handlerLocal{newFakeLocal(), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		seen <- string(b)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"object":"chat.completion"}`)
	})})
	waitReady(t, s, "gpu-a")
	place(t, s, "demo", "gpu-a")
	srv := httptest.NewServer(s.InferenceHandler(apikeys.RoleOnly("key"), api.AuthOptions{}, 0, 0))
	defer srv.Close()
	for _, body := range []string{`{"model":"secret1","Model":"demo"}`, `{"Model":"demo","model":"secret1"}`, `{"MODEL":"demo"}`, `{"model":"demo","model":"secret1"}`} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer key")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "invalid_request") {
			t.Errorf("%s: %d %s, want 400 invalid_request", body, resp.StatusCode, b)
		}
	}
	select {
	case got := <-seen:
		t.Fatalf("the host received %s", got)
	default:
	}
	if code, body := relayedChat(t, srv.URL, "demo"); code != http.StatusOK {
		t.Fatalf("a plain request: %d %s", code, body)
	}
}

// TestRelay_HeaderHygiene (L3): a client's proxy credentials, forwarding
// headers and cookies do not reach the host, and a host's cookies, CORS
// headers and other headers do not reach the client, streamed or not.
func TestRelay_HeaderHygiene(t *testing.T) {
	s := testServer(t, ServerOptions{})
	got := make(chan http.Header, 4)
	joinHost(t, s, "gpu-a", handlerLocal{newFakeLocal(), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Clone()
		body, _ := io.ReadAll(r.Body)
		h := w.Header()
		h.Set("Set-Cookie", "session=stolen; Path=/")
		h.Set("Access-Control-Allow-Origin", "*")
		h.Set("Access-Control-Allow-Credentials", "true")
		h.Set("X-Host-Says", "hello")
		h.Set("Server", "evil/1")
		if strings.Contains(string(body), `"stream":true`) {
			h.Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: {}\n\ndata: [DONE]\n\n")
			return
		}
		h.Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"object":"chat.completion"}`)
	})})
	waitReady(t, s, "gpu-a")
	place(t, s, "demo", "gpu-a")
	srv := httptest.NewServer(s.InferenceHandler(apikeys.RoleOnly("key"), api.AuthOptions{}, 0, 0))
	defer srv.Close()
	for _, stream := range []bool{false, true} {
		body := `{"model":"demo","messages":[]}`
		if stream {
			body = `{"model":"demo","stream":true,"messages":[]}`
		}
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer key")
		req.Header.Set("Proxy-Authorization", "Basic cHJveHk6c2VjcmV0")
		req.Header.Set("X-Forwarded-For", "203.0.113.7")
		req.Header.Set("Forwarded", "for=203.0.113.7")
		req.Header.Set("X-Real-Ip", "203.0.113.7")
		req.Header.Set("Cookie", "dashboard=secret")
		req.Header.Set("X-Request-Id", "client-7")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("stream %v: %d", stream, resp.StatusCode)
		}
		h := <-got
		for _, k := range []string{"Proxy-Authorization", "X-Forwarded-For", "Forwarded", "X-Real-Ip", "Cookie", "Authorization"} {
			if v := h.Get(k); v != "" {
				t.Errorf("stream %v: the host received %s: %s", stream, k, v)
			}
		}
		if h.Get("X-Request-Id") != "client-7" {
			t.Errorf("stream %v: the client's X-Request-Id did not reach the host: %v", stream, h)
		}
		for _, k := range []string{"Set-Cookie", "Access-Control-Allow-Origin", "Access-Control-Allow-Credentials", "X-Host-Says", "Server"} {
			if v := resp.Header.Get(k); v != "" {
				t.Errorf("stream %v: the client received the host's %s: %s", stream, k, v)
			}
		}
		if resp.Header.Get("Content-Type") == "" {
			t.Errorf("stream %v: the answer lost its Content-Type", stream)
		}
	}
}

// TestHost_KeyFilesOwnerOnly (L9): a host whose key (or its directory)
// other users can read refuses to start with invalid_config naming the
// chmod, rather than use a key that is no longer its own alone.
func TestHost_KeyFilesOwnerOnly(t *testing.T) {
	s := testServer(t, ServerOptions{})
	tok, err := s.NewJoinToken("", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	o := hostagent.HostOptions{StateDir: dir, Server: s.Addr(), JoinToken: tok.Token, Name: "gpu-a", Local: newFakeLocal()}
	if _, err := hostagent.NewHost(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	o.JoinToken = ""
	for _, c := range []struct {
		path string
		mode os.FileMode
	}{{filepath.Join(hostagent.PKIDir(dir), "host.key"), 0o644}, {filepath.Join(hostagent.PKIDir(dir), "host.key"), 0o640}, {hostagent.PKIDir(dir), 0o755}} {
		good := os.FileMode(0o600)
		if c.mode.Perm()&0o100 != 0 {
			good = 0o700
		}
		if err := os.Chmod(c.path, c.mode); err != nil {
			t.Fatal(err)
		}
		_, err := hostagent.NewHost(context.Background(), o)
		if !structs.HasCode(err, structs.CodeInvalidConfig) || !strings.Contains(err.Error(), "chmod") {
			t.Fatalf("%s with mode %04o: %v, want invalid_config naming the chmod", c.path, c.mode, err)
		}
		if err := os.Chmod(c.path, good); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := hostagent.NewHost(context.Background(), o); err != nil {
		t.Fatalf("owner-only again: %v", err)
	}
}
