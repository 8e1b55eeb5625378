// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"bytes"
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/pki"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/core/version"
)

// Local is what a host offers the server: its inventory, its ledger
// readings, its instances, and the handler the relay serves (the host's
// own inference and management APIs, credentials supplied).
type Local interface {
	Inventory() *hostv1.Inventory
	Readings() []*hostv1.LedgerReading
	Journals() []*hostv1.InstanceJournal
	RelayHandler() http.Handler
	// Events returns the host's events after cursor (at most max) and the
	// cursor after them; max 0 asks only for the cursor of now.
	Events(cursor uint64, max int) ([]*hostv1.Event, uint64)
}

// HostOptions configure a host's side of the fleet.
type HostOptions struct {
	// StateDir holds the host's key, certificate and the pinned CA
	// (<state_dir>/host-pki, owner-only).
	StateDir string
	// Server is the server's cluster address.
	Server string
	// JoinToken joins a host that holds no valid certificate yet.
	JoinToken string
	// Name is the host name its certificate carries.
	Name   string
	Local  Local
	Logger hclog.Logger
}

// Host is a host's side: enrolment, renewal, the link and the relay.
type Host struct {
	o      HostOptions
	logger hclog.Logger
	ca     *x509.Certificate
	creds  *pki.Credentials
	key    crypto.Signer

	mu       sync.Mutex
	primary  *serverLink            // the link to o.Server: first contact and fallback
	others   map[string]*serverLink // the links to the cluster's other servers, by name
	members  []*hostv1.ClusterServer
	runCtx   context.Context // Run's: the others' loops run under it
	runWG    sync.WaitGroup
	welcomed chan struct{}
	fatal    chan error
	once     sync.Once
	localIP  atomic.Value // string: LocalIP
}

// serverLink is the host's link and relay to one server of the cluster:
// each server keeps its own view of the host (its journals, heartbeats,
// events), routes to it over its relay, and the leader commands it there.
type serverLink struct {
	addr    string
	primary bool

	// Under Host.mu.
	name     string // the server's name, once it said it
	cancel   context.CancelFunc
	cursor   uint64 // the host's events this server acknowledged
	cursorOK bool   // cursor was read
	linked   bool
	lastErr  error
	welcomed chan struct{}
	once     sync.Once
}

func newServerLink(addr string, primary bool) *serverLink {
	return &serverLink{addr: addr, primary: primary, welcomed: make(chan struct{})}
}

// hostPKIDir is where a host keeps its credentials.
func hostPKIDir(stateDir string) string { return filepath.Join(stateDir, "host-pki") }

// NewHost loads the host's credentials, joining the server with the join
// token when it has none (or only an expired one). A refused join is the
// catalogue's code (join_token_used, join_ca_mismatch...).
func NewHost(ctx context.Context, o HostOptions) (*Host, error) {
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	if o.Server == "" {
		return nil, structs.Errf(structs.CodeInvalidConfig, "a host needs its server's address (--server ADDR, server_address, CAPYCTL_SERVER_ADDRESS)")
	}
	h := &Host{o: o, logger: o.Logger.Named("fleet"), welcomed: make(chan struct{}), fatal: make(chan error, 1),
		primary: newServerLink(o.Server, true), others: map[string]*serverLink{}}
	h.loadServers()
	err := h.load()
	switch {
	case err == nil && time.Now().Before(h.creds.Current().Leaf.NotAfter):
		if h.creds.Current().Leaf.Subject.CommonName != o.Name {
			return nil, structs.Errf(structs.CodeHostNameChanged, "this host joined as %q and now names itself %q: run it with hostname = %q, or remove the host on the server and join again with a new token",
				h.creds.Current().Leaf.Subject.CommonName, o.Name, h.creds.Current().Leaf.Subject.CommonName)
		}
		return h, nil
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return nil, structs.Wrap(structs.CodeInvalidConfig, err, "read the host's credentials in %s", hostPKIDir(o.StateDir))
	}
	if o.JoinToken == "" {
		if err == nil {
			return nil, structs.Errf(structs.CodeUnauthorized, "this host's certificate expired at %s: join again with a new token (capyctl create join-token on the server)",
				h.creds.Current().Leaf.NotAfter.UTC().Format(time.RFC3339))
		}
		return nil, structs.Errf(structs.CodeJoinTokenInvalid, "this host has not joined a server yet: pass --join-token-file FILE or CAPYCTL_JOIN_TOKEN (capyctl create join-token on the server prints one)")
	}
	if err := h.join(ctx); err != nil {
		return nil, err
	}
	return h, nil
}

// load reads the key, the certificate and the pinned CA.
func (h *Host) load() error {
	dir := hostPKIDir(h.o.StateDir)
	// IMPORTANT: a key another user could read is not this host's alone:
	// refused, never used or repaired (pki.OwnerOnly).
	if err := pki.OwnerOnly(dir, true); err != nil {
		return err
	}
	read := func(name, typ string) ([]byte, error) {
		if err := pki.OwnerOnly(filepath.Join(dir, name), false); err != nil {
			return nil, err
		}
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		b, _ := pem.Decode(data)
		if b == nil || b.Type != typ {
			return nil, fmt.Errorf("%s is not a PEM %s", name, typ)
		}
		return b.Bytes, nil
	}
	keyDER, err := read("host.key", "PRIVATE KEY")
	if err != nil {
		return err
	}
	certDER, err := read("host.crt", "CERTIFICATE")
	if err != nil {
		return err
	}
	caDER, err := read("ca.crt", "CERTIFICATE")
	if err != nil {
		return err
	}
	k, err := x509.ParsePKCS8PrivateKey(keyDER)
	if err != nil {
		return err
	}
	key, ok := k.(crypto.Signer)
	if !ok {
		return errors.New("host.key is not a signing key")
	}
	cert, err := x509.ParseCertificate(certDER)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	h.key, h.ca = key, ca
	h.creds = pki.NewCredentials(key, &pki.Issued{Certificate: cert, CA: caDER})
	return nil
}

// save writes the credentials owner-only, each file replaced atomically.
func (h *Host) save(key crypto.Signer, cert *x509.Certificate, caDER []byte) error {
	dir := hostPKIDir(h.o.StateDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	for _, f := range []struct {
		name, typ string
		der       []byte
	}{{"host.key", "PRIVATE KEY", keyDER}, {"host.crt", "CERTIFICATE", cert.Raw}, {"ca.crt", "CERTIFICATE", caDER}} {
		tmp := filepath.Join(dir, f.name+".tmp")
		if err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der}), 0o600); err != nil {
			return err
		}
		if err := os.Rename(tmp, filepath.Join(dir, f.name)); err != nil {
			return err
		}
	}
	return nil
}

// serverName is the name the host checks a server's certificate for.
func serverName(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return host
}

// join enrols with the join token: the server's CA is pinned by the
// token's fingerprint before the token is sent.
func (h *Host) join(ctx context.Context) error {
	tok, err := pki.ParseJoinToken(h.o.JoinToken)
	if err != nil {
		return err
	}
	key, err := pki.NewKey()
	if err != nil {
		return err
	}
	csr, err := pki.NewCSR(key, h.o.Name)
	if err != nil {
		return err
	}
	req := JoinRequest{Token: h.o.JoinToken, CSR: csr}
	if h.creds != nil {
		req.Previous = h.creds.Current().Leaf.Raw
	}
	cfg := pki.HostJoinTLS(tok.Fingerprint)
	cfg.NextProtos = []string{ALPNJoin, ALPNHTTP1}
	cfg.ServerName = serverName(h.o.Server)
	ans, err := h.post(ctx, cfg, h.o.Server, "/join", "application/json", mustJSON(req))
	if err != nil {
		return err
	}
	ca, err := pki.PinCA(ans.CA, tok.Fingerprint)
	if err != nil {
		return err
	}
	cert, err := x509.ParseCertificate(ans.Certificate)
	if err != nil {
		return structs.Wrap(structs.CodeJoinCAMismatch, err, "parse the host certificate")
	}
	if err := cert.CheckSignatureFrom(ca); err != nil {
		return structs.Wrap(structs.CodeJoinCAMismatch, err, "the host certificate is not from the pinned CA")
	}
	if err := h.save(key, cert, ans.CA); err != nil {
		return structs.Wrap(structs.CodeInvalidConfig, err, "save the host's credentials")
	}
	h.key, h.ca = key, ca
	h.creds = pki.NewCredentials(key, &pki.Issued{Certificate: cert, CA: ans.CA})
	h.logger.Info("joined the server", "server", h.o.Server, "host", h.o.Name, "certificate_expires", cert.NotAfter.UTC().Format(time.RFC3339))
	return nil
}

// post sends one join or renewal and decodes its answer or its coded
// refusal.
func (h *Host) post(ctx context.Context, cfg *tls.Config, addr, path, ctype string, body []byte) (*JoinAnswer, error) {
	tr := &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: false, TLSHandshakeTimeout: handshakeTimeout}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+addr+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", ctype)
	resp, err := cl.Do(req)
	if err != nil {
		var se *structs.Error
		if errors.As(err, &se) {
			return nil, se
		}
		return nil, structs.Wrap(structs.CodeUnavailable, err, "reach the server at %s", addr)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return nil, hostError("server", resp.StatusCode, data)
	}
	var ans JoinAnswer
	if err := json.Unmarshal(data, &ans); err != nil {
		return nil, structs.Wrap(structs.CodeInternal, err, "the server's answer")
	}
	return &ans, nil
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// tlsFor is the host's mutual TLS config for one conversation with the
// server at addr.
func (h *Host) tlsFor(addr, alpn string) *tls.Config {
	c := pki.HostTLS(h.ca, h.creds)
	c.NextProtos = []string{alpn}
	c.ServerName = serverName(addr)
	return c
}

// LocalIP is this host's address on its connection to the server (the
// relay's local address), empty before the first relay came up: a group
// member's default peer address.
func (h *Host) LocalIP() string {
	v, _ := h.localIP.Load().(string)
	return v
}

// CertExpiry is when the host's current certificate expires.
func (h *Host) CertExpiry() time.Time { return h.creds.Current().Leaf.NotAfter }

// Run keeps the link, the relay and the certificate up until ctx ends. It
// returns early with the server's refusal when the server will never take
// this host (host_name_changed, host_revoked).
func (h *Host) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		h.runWG.Wait()
	}()
	h.mu.Lock()
	h.runCtx = ctx
	h.goLocked(ctx, h.runRenew)
	h.startLocked(ctx, h.primary)
	h.mu.Unlock()
	h.reconcile() // the servers this host knew at its last run
	select {
	case <-ctx.Done():
		return nil
	case err := <-h.fatal:
		return err
	}
}

// goLocked runs f under ctx until Run returns; the caller holds mu.
func (h *Host) goLocked(ctx context.Context, f func(context.Context)) {
	h.runWG.Add(1)
	go func() {
		defer h.runWG.Done()
		f(ctx)
	}()
}

// startLocked runs the link and the relay to one server until its context
// ends; the caller holds mu.
func (h *Host) startLocked(ctx context.Context, l *serverLink) {
	ctx, l.cancel = context.WithCancel(ctx)
	h.goLocked(ctx, func(ctx context.Context) { h.runLink(ctx, l) })
	h.goLocked(ctx, func(ctx context.Context) { h.runRelay(ctx, l) })
}

// learn takes the cluster's servers one server told this host (in its
// Welcome, or when the configuration changed) and runs a link and a relay
// to every member, stops those to servers no longer members. The primary
// server (o.Server) is always kept: it is the first contact and the
// fallback when the others are unknown.
func (h *Host) learn(l *serverLink, cs *hostv1.ClusterServers) {
	if cs == nil || cs.GetSelf() == "" {
		return // a server alone
	}
	h.mu.Lock()
	l.name = cs.GetSelf()
	h.members = cs.GetServers()
	h.mu.Unlock()
	h.saveServers()
	h.reconcile()
}

// reconcile starts and stops the links to the other servers to match the
// members last learned (nothing before Run).
func (h *Host) reconcile() {
	h.mu.Lock()
	defer h.mu.Unlock()
	ctx := h.runCtx
	if ctx == nil || ctx.Err() != nil {
		return
	}
	want := map[string]string{}
	for _, m := range h.members {
		if m.GetName() == "" || m.GetAddress() == "" || m.GetName() == h.primary.name || m.GetAddress() == h.primary.addr {
			continue
		}
		if h.primary.name == "" && len(h.members) > 0 && h.primary.addr != "" {
			// The primary's name is not known yet: an address that may be
			// its own under another spelling would make two links from this
			// host to one server, each ending the other's.
			continue
		}
		want[m.GetName()] = m.GetAddress()
	}
	for name, l := range h.others {
		if addr, ok := want[name]; !ok || addr != l.addr {
			l.cancel()
			delete(h.others, name)
			h.logger.Info("stopped the link to a server no longer in the cluster", "server", name, "address", l.addr)
		}
	}
	for name, addr := range want {
		if h.others[name] != nil {
			continue
		}
		l := newServerLink(addr, false)
		l.name = name
		h.others[name] = l
		h.startLocked(ctx, l)
		h.logger.Info("linking to another server of the cluster", "server", name, "address", addr)
	}
}

// knownServers is the file that remembers the cluster's servers across a
// host's restarts (owner-only, beside its credentials): a host whose own
// server is down at its start still reaches the others.
func (h *Host) knownServers() string { return filepath.Join(hostPKIDir(h.o.StateDir), "servers.json") }

type knownServers struct {
	Primary string                  `json:"primary"`
	Servers []*hostv1.ClusterServer `json:"servers"`
}

func (h *Host) loadServers() {
	data, err := os.ReadFile(h.knownServers())
	if err != nil {
		return
	}
	var ks knownServers
	if json.Unmarshal(data, &ks) == nil {
		h.primary.name, h.members = ks.Primary, ks.Servers
	}
}

func (h *Host) saveServers() {
	h.mu.Lock()
	data := mustJSON(knownServers{Primary: h.primary.name, Servers: h.members})
	h.mu.Unlock()
	tmp := h.knownServers() + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err == nil {
		err = os.Rename(tmp, h.knownServers())
		if err != nil {
			h.logger.Debug("remember the cluster's servers", "error", err)
		}
	}
}

// Linked reports whether a link to a server is up now, and the primary
// server's last error.
func (h *Host) Linked() (bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	up := h.primary.linked
	for _, l := range h.others {
		up = up || l.linked
	}
	return up, h.primary.lastErr
}

// Servers reports each server this host keeps a link to, by address, and
// whether that link is up now.
func (h *Host) Servers() map[string]bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string]bool{h.primary.addr: h.primary.linked}
	for _, l := range h.others {
		out[l.addr] = l.linked
	}
	return out
}

// Welcomed is closed once the server first accepted the host's link.
func (h *Host) Welcomed() <-chan struct{} { return h.welcomed }

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
	conn, err := grpc.NewClient(l.addr, grpc.WithTransportCredentials(credentials.NewTLS(h.tlsFor(l.addr, ALPNLink))))
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
	seq := uint64(0)
	send := func(m *hostv1.HostMessage) error {
		seq++
		m.Seq = seq
		return stream.Send(m)
	}
	journals := h.o.Local.Journals()
	inv := h.o.Local.Inventory()
	invSent := inventoryDigest(inv)
	if err := send(&hostv1.HostMessage{Body: &hostv1.HostMessage_Hello{Hello: &hostv1.Hello{
		HostName: h.o.Name, Version: version.Version, Protocol: 1, Inventory: inv, Instances: journals}}}); err != nil {
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	wel := first.GetWelcome()
	if wel == nil {
		return structs.Errf(structs.CodeInternal, "the server's first message is not Welcome")
	}
	if !wel.GetAccepted() {
		return structs.Errf(structs.Code(wel.GetCode()), "the server refused the host: %s", wel.GetMessage())
	}
	beat := time.Duration(wel.GetHeartbeatIntervalMs()) * time.Millisecond
	if beat <= 0 {
		beat = DefaultHeartbeat
	}
	h.mu.Lock()
	l.linked, l.lastErr = true, nil
	h.mu.Unlock()
	h.once.Do(func() { close(h.welcomed) })
	l.once.Do(func() { close(l.welcomed) })
	up()
	h.logger.Info("host link up", "server", l.addr, "name", wel.GetCluster().GetSelf())
	h.learn(l, wel.GetCluster())
	errc := make(chan error, 1)
	acks := make(chan uint64, 64)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				errc <- err
				return
			}
			if cs := m.GetServers(); cs != nil {
				h.learn(l, cs)
			}
			if a := m.GetAck(); a != nil {
				select {
				case acks <- a.GetSeq():
				case <-sctx.Done():
					return
				}
			}
		}
	}()
	sent := map[string][32]byte{}
	for _, j := range journals {
		sent[j.GetInstanceId()] = journalDigest(j)
	}
	h.mu.Lock()
	if !l.cursorOK { // the first link to this server: events from now on
		_, l.cursor = h.o.Local.Events(0, 0)
		l.cursorOK = true
	}
	// l.cursor is what the server acknowledged; a new link resends from
	// there. sentCursor is what this link has sent; pending maps each
	// event message's seq to the cursor after it.
	sentCursor := l.cursor
	h.mu.Unlock()
	pending := map[uint64]uint64{}
	t := time.NewTicker(beat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			_ = stream.CloseSend()
			return nil
		case err := <-errc:
			return err
		case acked := <-acks:
			h.mu.Lock()
			for sq, c := range pending {
				if sq <= acked {
					l.cursor = max(l.cursor, c)
					delete(pending, sq)
				}
			}
			h.mu.Unlock()
			continue
		case <-t.C:
		}
		hb := &hostv1.Heartbeat{TimeUnixMs: time.Now().UnixMilli(), Readings: h.o.Local.Readings()}
		if inv := h.o.Local.Inventory(); inventoryDigest(inv) != invSent {
			hb.Inventory, invSent = inv, inventoryDigest(inv)
		}
		if err := send(&hostv1.HostMessage{Body: &hostv1.HostMessage_Heartbeat{Heartbeat: hb}}); err != nil {
			return err
		}
		now := map[string]bool{}
		for _, j := range h.o.Local.Journals() {
			now[j.GetInstanceId()] = true
			d := journalDigest(j)
			if sent[j.GetInstanceId()] == d {
				continue
			}
			if err := send(&hostv1.HostMessage{Body: &hostv1.HostMessage_Journal{Journal: j}}); err != nil {
				return err
			}
			sent[j.GetInstanceId()] = d
		}
		// The host's events since the last beat. An event counts as
		// forwarded once the server acknowledged it: a link that breaks
		// first resends it on the next one.
		evs, next := h.o.Local.Events(sentCursor, 256)
		for i, ev := range evs {
			if err := send(&hostv1.HostMessage{Body: &hostv1.HostMessage_Event{Event: ev}}); err != nil {
				return err
			}
			if i == len(evs)-1 {
				pending[seq] = next
			}
		}
		sentCursor = next
		for id := range sent {
			if !now[id] { // gone: the instance's deployment was deleted
				if err := send(&hostv1.HostMessage{Body: &hostv1.HostMessage_Journal{Journal: &hostv1.InstanceJournal{
					InstanceId: id, State: string(structs.StateStopped), SinceUnixMs: time.Now().UnixMilli()}}}); err != nil {
					return err
				}
				delete(sent, id)
			}
		}
	}
}

func inventoryDigest(inv *hostv1.Inventory) [32]byte {
	b, _ := json.Marshal(inv)
	return sha256.Sum256(b)
}

func journalDigest(j *hostv1.InstanceJournal) [32]byte {
	b, _ := json.Marshal(j)
	return sha256.Sum256(b)
}

// runRelay keeps the relay connection to one server open: the host dials,
// then serves HTTP/2 on it until it breaks.
func (h *Host) runRelay(ctx context.Context, l *serverLink) {
	select {
	case <-l.welcomed:
	case <-ctx.Done():
		return
	}
	srv := &http2.Server{MaxConcurrentStreams: 4096, ReadIdleTimeout: 10 * time.Second, PingTimeout: 5 * time.Second}
	for attempt := 0; ctx.Err() == nil; attempt++ {
		d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: handshakeTimeout, KeepAlive: 15 * time.Second}, Config: h.tlsFor(l.addr, ALPNRelay)}
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

// runRenew renews the host certificate at two thirds of its life, over
// mutual TLS with the current one; a failed renewal is retried every
// minute until the certificate expires.
func (h *Host) runRenew(ctx context.Context) {
	renewed := false
	for {
		leaf := h.creds.Current().Leaf
		wait := time.Until(pki.RenewAt(leaf))
		// A host whose clock runs ahead of the server's would see every
		// new certificate due at once: renew no more often than a tenth
		// of a lifetime.
		if floor := leaf.NotAfter.Sub(leaf.NotBefore) / 10; renewed && wait < floor {
			wait = floor
		}
		if wait < 0 {
			wait = 0
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		err := h.renew(ctx)
		renewed = err == nil
		if err != nil {
			h.logger.Warn("certificate renewal failed; retrying in a minute", "error", err,
				"expires", h.creds.Current().Leaf.NotAfter.UTC().Format(time.RFC3339))
			t := time.NewTimer(time.Minute)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
	}
}

// renew asks the server for a new certificate for a new key.
func (h *Host) renew(ctx context.Context) error {
	key, err := pki.NewKey()
	if err != nil {
		return err
	}
	csr, err := pki.NewCSR(key, h.o.Name)
	if err != nil {
		return err
	}
	// Any server of the cluster signs (they share the CA): the primary
	// first, then the others.
	h.mu.Lock()
	addrs := []string{h.primary.addr}
	for _, l := range h.others {
		addrs = append(addrs, l.addr)
	}
	h.mu.Unlock()
	var ans *JoinAnswer
	for _, addr := range addrs {
		if ans, err = h.post(ctx, h.tlsFor(addr, ALPNHTTP1), addr, "/renew", "application/octet-stream", csr); err == nil {
			break
		}
	}
	if err != nil {
		return err
	}
	cert, err := x509.ParseCertificate(ans.Certificate)
	if err != nil {
		return err
	}
	if err := cert.CheckSignatureFrom(h.ca); err != nil {
		return structs.Wrap(structs.CodeJoinCAMismatch, err, "the renewed certificate is not from the pinned CA")
	}
	if err := h.save(key, cert, h.ca.Raw); err != nil {
		return err
	}
	h.creds.Set(key, &pki.Issued{Certificate: cert, CA: h.ca.Raw})
	h.logger.Info("certificate renewed", "expires", cert.NotAfter.UTC().Format(time.RFC3339))
	return nil
}

// Status is the host's link as `capyctl status` on the host shows it.
func (h *Host) Status() wire.Host {
	linked, _ := h.Linked()
	exp := h.CertExpiry().UTC()
	st := wire.HostLost
	if linked {
		st = wire.HostReady
	}
	return wire.Host{Name: h.o.Name, Role: "host", Online: linked, State: st, Address: h.o.Server, CertExpiresAt: &exp}
}
