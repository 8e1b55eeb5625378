// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package hostagent

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/capyctl/capyctl/core/fleet/linkwire"
	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/core/version"
)

// backoff waits before a reconnect: 250 ms doubling to 5 s.
func backoff(ctx context.Context, attempt int) bool {
	d := 250 * time.Millisecond << min(attempt, 5)
	if d > 5*time.Second {
		d = 5 * time.Second
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// runLink keeps the Connect stream to one server open, reconnecting with
// backoff. Only the primary server's lasting refusal stops the host: another
// server of the cluster may not have applied the host's join yet.
func (h *Host) runLink(ctx context.Context, l *serverLink) {
	refused := 0 // handshakes refused in a row after a link the server took
	linkedOnce := false
	for attempt := 0; ctx.Err() == nil; attempt++ {
		err := h.link(ctx, l, func() { attempt, refused, linkedOnce = 0, 0, true })
		h.mu.Lock()
		l.linked, l.lastErr = false, err
		h.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		if !l.primary {
			// Said once per outage: a server of the cluster may be down for
			// a while (its restart, its removal not yet heard of).
			log := h.logger.Debug
			if attempt == 0 {
				log = h.logger.Warn
			}
			log("host link to a server of the cluster down; reconnecting", "server", l.addr, "name", l.name, "error", err)
			if !backoff(ctx, attempt) {
				return
			}
			continue
		}
		if se := structs.AsError(err); se.Code == structs.CodeHostNameChanged || se.Code == structs.CodeHostRevoked {
			select {
			case h.fatal <- err:
			default:
			}
			return
		}
		if err != nil && strings.Contains(err.Error(), "bad certificate") {
			// TLS says no more: the server refused the certificate itself.
			h.logger.Error("the server refuses this host's certificate: the host was removed (capyctl remove host), or its certificate expired; "+
				"stop the host, delete its host-pki directory and start it again with a new join token", "server", l.addr, "state", hostPKIDir(h.o.StateDir))
			// A server that took this certificate before and refuses it now,
			// again and again, has removed the host: stop for good (exit 3).
			if refused++; linkedOnce && refused >= 3 {
				select {
				case h.fatal <- structs.Errf(structs.CodeHostRevoked, "the server at %s refuses this host's certificate: the host was removed, or its certificate expired; join again with a new token", l.addr):
				default:
				}
				return
			}
		} else if structs.HasCode(err, structs.CodeHostUnknown) {
			// Not for good: a cluster restored from a snapshot names the
			// host once the restore is done.
			h.logger.Warn("the server does not know this host (yet); trying again", "server", l.addr, "code", string(structs.CodeHostUnknown), "error", err)
		} else {
			h.logger.Warn("host link down; reconnecting", "server", l.addr, "error", err)
		}
		if !backoff(ctx, attempt) {
			return
		}
	}
}

// link runs one Connect stream to one server until it breaks.
func (h *Host) link(ctx context.Context, l *serverLink, up func()) error {
	conn, err := grpc.NewClient(l.addr, grpc.WithTransportCredentials(credentials.NewTLS(h.tlsFor(l.addr, linkwire.ALPNLink))))
	if err != nil {
		return err
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := hostv1.NewHostLinkClient(conn).Connect(sctx)
	if err != nil {
		return err
	}
	ls := &linkSession{h: h, l: l, stream: stream, sent: map[string][32]byte{}, pending: map[uint64]uint64{}}
	beat, err := ls.hello()
	if err != nil {
		return err
	}
	up()
	acks := make(chan uint64, 64)
	errc := make(chan error, 1)
	go func() { errc <- ls.receive(sctx, acks) }()
	return ls.run(ctx, beat, acks, errc)
}

// linkSession is one Connect stream to one server, owned by the
// goroutine that runs it (its receive loop sends only to channels).
type linkSession struct {
	h      *Host
	l      *serverLink
	stream hostv1.HostLink_ConnectClient
	seq    uint64
	// sent is each instance's journal as last sent (digest); invSent the
	// inventory's.
	sent    map[string][32]byte
	invSent [32]byte
	// sentCursor is what this link has sent of the host's events; pending
	// maps each event message's seq to the cursor after it.
	sentCursor uint64
	pending    map[uint64]uint64
}

func (ls *linkSession) send(m *hostv1.HostMessage) error {
	ls.seq++
	m.Seq = ls.seq
	return ls.stream.Send(m)
}

// hello sends Hello (the host's inventory and every instance's journal)
// and reads the server's Welcome: the heartbeat interval, the cluster's
// servers and the server's term.
func (ls *linkSession) hello() (time.Duration, error) {
	h, l := ls.h, ls.l
	journals := h.o.Local.Journals()
	inv := h.o.Local.Inventory()
	ls.invSent = inventoryDigest(inv)
	for _, j := range journals {
		ls.sent[j.GetInstanceId()] = journalDigest(j)
	}
	if err := ls.send(&hostv1.HostMessage{Body: &hostv1.HostMessage_Hello{Hello: &hostv1.Hello{
		HostName: h.o.Name, Version: version.Version, Protocol: 1, Inventory: inv, Instances: journals}}}); err != nil {
		return 0, err
	}
	first, err := ls.stream.Recv()
	if err != nil {
		return 0, err
	}
	wel := first.GetWelcome()
	if wel == nil {
		return 0, structs.Errf(structs.CodeInternal, "the server's first message is not Welcome")
	}
	h.seeTerm(wel.GetTerm())
	if !wel.GetAccepted() {
		return 0, structs.Errf(structs.Code(wel.GetCode()), "the server refused the host: %s", wel.GetMessage())
	}
	beat := time.Duration(wel.GetHeartbeatIntervalMs()) * time.Millisecond
	if beat <= 0 {
		beat = linkwire.DefaultHeartbeat
	}
	h.mu.Lock()
	l.linked, l.lastErr = true, nil
	if !l.cursorOK { // the first link to this server: events from now on
		_, l.cursor = h.o.Local.Events(0, 0)
		l.cursorOK = true
	}
	// l.cursor is what the server acknowledged: a new link resends from
	// there.
	ls.sentCursor = l.cursor
	h.mu.Unlock()
	h.once.Do(func() { close(h.welcomed) })
	l.once.Do(func() { close(l.welcomed) })
	h.logger.Info("host link up", "server", l.addr, "name", wel.GetCluster().GetSelf())
	h.learn(l, wel.GetCluster())
	return beat, nil
}

// receive reads the server's messages until the stream breaks: the
// cluster's servers, acknowledgements (to acks), desired state (to the
// host's reconciler, fenced by term).
func (ls *linkSession) receive(ctx context.Context, acks chan<- uint64) error {
	for {
		m, err := ls.stream.Recv()
		if err != nil {
			return err
		}
		switch b := m.GetBody().(type) {
		case *hostv1.ServerMessage_Servers:
			ls.h.learn(ls.l, b.Servers)
		case *hostv1.ServerMessage_Desired:
			ls.h.offerDesired(ls.l, b.Desired)
		case *hostv1.ServerMessage_Command:
			ls.h.offerCommand(ls.l, b.Command)
		case *hostv1.ServerMessage_Ack:
			select {
			case acks <- b.Ack.GetSeq():
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
}

// run sends until the link breaks: a heartbeat (readings, and the
// inventory when it changed) every beat; every instance's change and the
// host's new events as soon as the host's own change signal fires; the
// answers the host's reconciler queued for this server.
func (ls *linkSession) run(ctx context.Context, beat time.Duration, acks <-chan uint64, errc <-chan error) error {
	t := time.NewTicker(beat)
	defer t.Stop()
	// The change signal is taken anew only once it fired, before the
	// journals are read: a change while an ack is handled is never missed.
	changed := ls.h.o.Local.Changed()
	for {
		select {
		case <-ctx.Done():
			_ = ls.stream.CloseSend()
			return nil
		case err := <-errc:
			return err
		case acked := <-acks:
			ls.acked(acked)
			continue
		case m := <-ls.l.out:
			// IMPORTANT: the journals first. An answer (a command's result,
			// a share's) follows the record writes it reports; sent ahead
			// of their journals, it let the server act on a journal older
			// than the answer (a group's member read "ready" just after its
			// park was answered), so the server read members with a
			// management call instead.
			if err := ls.flush(); err != nil {
				return err
			}
			if err := ls.send(m); err != nil {
				return err
			}
			continue
		case <-changed:
			changed = ls.h.o.Local.Changed()
		case <-t.C:
			if err := ls.heartbeat(); err != nil {
				return err
			}
		}
		if err := ls.flush(); err != nil {
			return err
		}
	}
}

// acked records what the server acknowledged of the host's events.
func (ls *linkSession) acked(seq uint64) {
	ls.h.mu.Lock()
	defer ls.h.mu.Unlock()
	for sq, c := range ls.pending {
		if sq <= seq {
			ls.l.cursor = max(ls.l.cursor, c)
			delete(ls.pending, sq)
		}
	}
}

func (ls *linkSession) heartbeat() error {
	hb := &hostv1.Heartbeat{TimeUnixMs: time.Now().UnixMilli(), Readings: ls.h.o.Local.Readings()}
	if inv := ls.h.o.Local.Inventory(); inventoryDigest(inv) != ls.invSent {
		hb.Inventory, ls.invSent = inv, inventoryDigest(inv)
	}
	return ls.send(&hostv1.HostMessage{Body: &hostv1.HostMessage_Heartbeat{Heartbeat: hb}})
}

// flush sends every instance journal that changed since it was last sent
// (a stopped one for an instance gone: its deployment deleted) and the
// host's events since the last ones sent. An event counts as forwarded
// once the server acknowledged it: a link that breaks first resends it on
// the next one.
func (ls *linkSession) flush() error {
	now := map[string]bool{}
	for _, j := range ls.h.o.Local.Journals() {
		now[j.GetInstanceId()] = true
		d := journalDigest(j)
		if ls.sent[j.GetInstanceId()] == d {
			continue
		}
		if err := ls.send(&hostv1.HostMessage{Body: &hostv1.HostMessage_Journal{Journal: j}}); err != nil {
			return err
		}
		ls.sent[j.GetInstanceId()] = d
	}
	evs, next := ls.h.o.Local.Events(ls.sentCursor, 256)
	for i, ev := range evs {
		if err := ls.send(&hostv1.HostMessage{Body: &hostv1.HostMessage_Event{Event: ev}}); err != nil {
			return err
		}
		if i == len(evs)-1 {
			ls.pending[ls.seq] = next
		}
	}
	ls.sentCursor = next
	for id := range ls.sent {
		if !now[id] {
			if err := ls.send(&hostv1.HostMessage{Body: &hostv1.HostMessage_Journal{Journal: &hostv1.InstanceJournal{
				InstanceId: id, State: string(structs.StateStopped), SinceUnixMs: time.Now().UnixMilli()}}}); err != nil {
				return err
			}
			delete(ls.sent, id)
		}
	}
	return nil
}

func inventoryDigest(inv *hostv1.Inventory) [32]byte {
	b, _ := json.Marshal(inv)
	return sha256.Sum256(b)
}

func journalDigest(j *hostv1.InstanceJournal) [32]byte {
	b, _ := json.Marshal(j)
	return sha256.Sum256(b)
}

// relayMaxStreams is how many requests a server may relay to a host at
// once over its one relay connection. A stream past it waits on the
// server for another to end, so it is far above what a host's engines
// serve at once: an open stream costs the host a few KiB, not a slot.
const relayMaxStreams = 1 << 16

// runRelay keeps the relay connection to one server open: the host dials,
// then serves HTTP/2 on it until it breaks.
func (h *Host) runRelay(ctx context.Context, l *serverLink) {
	select {
	case <-l.welcomed:
	case <-ctx.Done():
		return
	}
	srv := &http2.Server{MaxConcurrentStreams: relayMaxStreams, ReadIdleTimeout: 10 * time.Second, PingTimeout: 5 * time.Second}
	for attempt := 0; ctx.Err() == nil; attempt++ {
		d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: linkwire.HandshakeTimeout, KeepAlive: 15 * time.Second}, Config: h.tlsFor(l.addr, linkwire.ALPNRelay)}
		c, err := d.DialContext(ctx, "tcp", l.addr)
		if err == nil {
			attempt = 0
			if ta, ok := c.LocalAddr().(*net.TCPAddr); ok {
				h.localIP.Store(ta.IP.String())
			}
			h.logger.Debug("relay up", "server", l.addr)
			stop := context.AfterFunc(ctx, func() { c.Close() })
			// http2's own complaints (a connection the server broke off)
			// go to the role's log as JSON, at debug, not to stderr.
			base := &http.Server{ErrorLog: h.logger.Named("relay").StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Debug})}
			srv.ServeConn(c, &http2.ServeConnOpts{Context: ctx, Handler: h.o.Local.RelayHandler(), BaseConfig: base})
			stop()
			c.Close()
		} else if ctx.Err() == nil {
			h.logger.Debug("relay dial failed", "server", l.addr, "error", err)
		}
		if !backoff(ctx, attempt) {
			return
		}
	}
}
