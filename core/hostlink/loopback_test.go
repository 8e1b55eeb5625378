// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package hostlink

import (
	"context"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/pki"
	"github.com/capyctl/capyctl/core/structs"
)

// The loopback tests run the generated HostLink service over a real
// loopback listener with core/pki's mutual TLS: a server stand-in (the
// server role is not built yet) and a host stand-in that answers commands
// through a Deduper.

// serverSide is one accepted Connect as the test drives it.
type serverSide struct {
	hello  *hostv1.Hello
	stream hostv1.HostLink_ConnectServer
	// recv carries every host message after Hello.
	recv chan *hostv1.HostMessage
}

// linkServer accepts Connect streams: it checks Hello against the host
// certificate's name, answers Welcome and hands accepted streams to the
// test.
type linkServer struct {
	hostv1.UnimplementedHostLinkServer
	conns chan *serverSide
}

func (s *linkServer) Connect(stream hostv1.HostLink_ConnectServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	name := ""
	if p, ok := peer.FromContext(stream.Context()); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
			name = ti.State.PeerCertificates[0].Subject.CommonName
		}
	}
	w := &hostv1.Welcome{Accepted: true, Protocol: 1, HeartbeatIntervalMs: 5000, ServerTimeUnixMs: time.Now().UnixMilli()}
	switch {
	case hello == nil:
		w = &hostv1.Welcome{Code: string(structs.CodeInvalidRequest), Message: "the first message must be Hello"}
	case hello.HostName != name:
		w = &hostv1.Welcome{Code: string(structs.CodeHostNameChanged), Message: "the certificate names " + name}
	}
	if err := stream.Send(&hostv1.ServerMessage{Body: &hostv1.ServerMessage_Welcome{Welcome: w}}); err != nil {
		return err
	}
	if !w.Accepted {
		return nil
	}
	side := &serverSide{hello: hello, stream: stream, recv: make(chan *hostv1.HostMessage, 16)}
	s.conns <- side
	for {
		m, err := stream.Recv()
		if err != nil {
			close(side.recv)
			return nil
		}
		side.recv <- m
	}
}

// countingHandler counts the engines it starts.
type countingHandler struct {
	fakeHandler
	starts int
}

func (c *countingHandler) StartInstance(ctx context.Context, s *hostv1.StartInstance) error {
	c.mu.Lock()
	c.starts++
	c.mu.Unlock()
	return c.fakeHandler.StartInstance(ctx, s)
}

func (c *countingHandler) Starts() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.starts
}

// hostSide is the host stand-in on one Connect stream.
type hostSide struct {
	stream  hostv1.HostLink_ConnectClient
	welcome *hostv1.Welcome
	acks    chan uint64

	sendMu sync.Mutex
	seq    uint64
}

func (h *hostSide) send(t *testing.T, m *hostv1.HostMessage) {
	h.sendMu.Lock()
	defer h.sendMu.Unlock()
	h.seq++
	m.Seq = h.seq
	if err := h.stream.Send(m); err != nil {
		t.Errorf("host send: %v", err)
	}
}

// connect opens a Connect stream as hostName, sends Hello and reads
// Welcome; when accepted it answers every Command through dd and h.
func connect(t *testing.T, ctx context.Context, cc *grpc.ClientConn, hostName string, dd *Deduper, h Handler) *hostSide {
	t.Helper()
	stream, err := hostv1.NewHostLinkClient(cc).Connect(ctx)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	hs := &hostSide{stream: stream, acks: make(chan uint64, 16)}
	hs.send(t, &hostv1.HostMessage{Body: &hostv1.HostMessage_Hello{Hello: &hostv1.Hello{
		HostName: hostName, Version: "0.1.0", Protocol: 1,
		Inventory: &hostv1.Inventory{
			HostMemoryBytes: 64 << 30,
			Cards:           []*hostv1.Card{{Uuid: "GPU-aaaa", Index: 0, Name: "Simulated 24G", MemoryBytes: 24 << 30}},
			Engines:         []*hostv1.Engine{{Name: "fake-vllm", Family: "vllm", Version: "0.9.0"}},
		},
	}}})
	first, err := stream.Recv()
	if err != nil {
		t.Fatalf("read welcome: %v", err)
	}
	hs.welcome = first.GetWelcome()
	if hs.welcome == nil || !hs.welcome.Accepted {
		return hs
	}
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				close(hs.acks)
				return
			}
			switch b := m.Body.(type) {
			case *hostv1.ServerMessage_Ack:
				hs.acks <- b.Ack.Seq
			case *hostv1.ServerMessage_Command:
				go func() {
					res, err := dd.Execute(stream.Context(), b.Command, h)
					if err != nil {
						return
					}
					hs.send(t, &hostv1.HostMessage{Body: &hostv1.HostMessage_Result{Result: res}})
				}()
			}
		}
	}()
	return hs
}

// newLink starts the server stand-in with the authority's ServerTLS and
// returns it with a client connection that presents a host certificate
// for hostName.
func newLink(t *testing.T, hostName string) (*linkServer, *grpc.ClientConn) {
	t.Helper()
	ca, err := pki.LoadOrCreateCA(filepath.Join(t.TempDir(), "pki"), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	auth, err := pki.NewAuthority(pki.AuthorityOptions{CA: ca, Store: pki.NewMemStore(),
		ServerNames: []string{"localhost"}, ServerIPs: []net.IP{net.ParseIP("127.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	token, err := auth.NewJoinTokenFor(hostName, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	key, err := pki.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.NewCSR(key, hostName)
	if err != nil {
		t.Fatal(err)
	}
	issued, err := auth.Enroll(pki.EnrollRequest{Token: token, CSR: csr})
	if err != nil {
		t.Fatal(err)
	}
	pinned, err := pki.PinCA(issued.CA, ca.Fingerprint())
	if err != nil {
		t.Fatal(err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &linkServer{conns: make(chan *serverSide, 4)}
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(auth.ServerTLS())))
	hostv1.RegisterHostLinkServer(gs, srv)
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)

	hostCfg := pki.HostTLS(pinned, pki.NewCredentials(key, issued))
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(hostCfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return srv, cc
}

// nextResult reads host messages until a CommandResult.
func nextResult(t *testing.T, side *serverSide) *hostv1.CommandResult {
	t.Helper()
	for m := range side.recv {
		if r := m.GetResult(); r != nil {
			return r
		}
	}
	t.Fatal("the stream ended before a command result")
	return nil
}

func sendCommand(t *testing.T, side *serverSide, cmd *hostv1.Command) {
	t.Helper()
	if err := side.stream.Send(&hostv1.ServerMessage{Body: &hostv1.ServerMessage_Command{Command: cmd}}); err != nil {
		t.Fatalf("server send: %v", err)
	}
}

// TestHostLink_Loopback: Hello → Welcome, a heartbeat and its Ack, a start
// command and its result, the same command_id again on the same stream and
// again after the host reconnected: answered from the Deduper, one engine
// started.
func TestHostLink_Loopback(t *testing.T) {
	srv, cc := newLink(t, "gpu-a")
	dd := NewDeduper(0)
	h := &countingHandler{}

	ctx, cancel := context.WithCancel(context.Background())
	host := connect(t, ctx, cc, "gpu-a", dd, h)
	if !host.welcome.GetAccepted() || host.welcome.HeartbeatIntervalMs != 5000 {
		t.Fatalf("welcome: got %v", host.welcome)
	}
	side := <-srv.conns
	if got := side.hello.GetInventory().GetCards(); len(got) != 1 || got[0].Uuid != "GPU-aaaa" {
		t.Fatalf("inventory: got %v", side.hello.GetInventory())
	}

	// A heartbeat with a ledger reading, acknowledged by its seq.
	host.send(t, &hostv1.HostMessage{Body: &hostv1.HostMessage_Heartbeat{Heartbeat: &hostv1.Heartbeat{
		TimeUnixMs: time.Now().UnixMilli(),
		Readings:   []*hostv1.LedgerReading{{Domain: "gpu0", DeviceUuid: "GPU-aaaa", CapacityBytes: 24 << 30}},
	}}})
	hb := <-side.recv
	if hb.GetHeartbeat().GetReadings()[0].GetDomain() != "gpu0" {
		t.Fatalf("heartbeat: got %v", hb)
	}
	if err := side.stream.Send(&hostv1.ServerMessage{Body: &hostv1.ServerMessage_Ack{Ack: &hostv1.Ack{Seq: hb.Seq}}}); err != nil {
		t.Fatal(err)
	}
	if got := <-host.acks; got != hb.Seq {
		t.Fatalf("ack: got seq %d, want %d", got, hb.Seq)
	}

	start := &hostv1.Command{CommandId: "cmd-start-1", Action: &hostv1.Command_Start{Start: &hostv1.StartInstance{
		InstanceId: "inst-1", Generation: 1, Deployment: "chat", Engine: "fake-vllm", CardUuids: []string{"GPU-aaaa"},
	}}}
	sendCommand(t, side, start)
	if r := nextResult(t, side); !r.Ok || r.Replayed || r.CommandId != "cmd-start-1" {
		t.Fatalf("first start: got %v", r)
	}
	sendCommand(t, side, start)
	if r := nextResult(t, side); !r.Ok || !r.Replayed || r.CommandId != "cmd-start-1" {
		t.Fatalf("retried start: got %v", r)
	}

	// The stream breaks; the host reconnects and the server retries.
	cancel()
	for range side.recv {
	}
	host2 := connect(t, context.Background(), cc, "gpu-a", dd, h)
	if !host2.welcome.GetAccepted() {
		t.Fatalf("welcome after reconnect: got %v", host2.welcome)
	}
	side2 := <-srv.conns
	sendCommand(t, side2, start)
	if r := nextResult(t, side2); !r.Ok || !r.Replayed {
		t.Fatalf("start retried after a reconnect: got %v", r)
	}
	if got := h.Starts(); got != 1 {
		t.Fatalf("engines started: %d, want 1", got)
	}
	host2.stream.CloseSend()
}

// TestHostLink_RefusesAnotherName: a Hello whose host name is not the
// certificate's is refused with host_name_changed.
func TestHostLink_RefusesAnotherName(t *testing.T) {
	_, cc := newLink(t, "gpu-a")
	host := connect(t, context.Background(), cc, "gpu-b", NewDeduper(0), &countingHandler{})
	if w := host.welcome; w.GetAccepted() || w.GetCode() != string(structs.CodeHostNameChanged) {
		t.Fatalf("welcome: got %v", w)
	}
}
