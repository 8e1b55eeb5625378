// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package hostagent

import (
	"bytes"
	"context"
	"crypto"
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
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/capyctl/capyctl/core/fleet/linkwire"
	"github.com/capyctl/capyctl/core/hostlink"
	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/pki"
	"github.com/capyctl/capyctl/core/structs"
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
	// Changed returns a channel closed at the host's next change (an
	// instance's transition): the link sends what changed at once.
	Changed() <-chan struct{}
	// ApplyDesired reconciles what the host runs with its share of the
	// cluster's desired state (engines, deployments) and says what it
	// could not do, one result each.
	ApplyDesired(ctx context.Context, d *hostv1.Desired) []*hostv1.DesiredResult
	// Commands carries out the leader's commands (what is not desired
	// state), each once (the host's Deduper).
	Commands() hostlink.Handler
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

	// The fence and the reconciler's input (hostdesired.go).
	termMu     sync.Mutex
	term       uint64
	desired    *offered
	desiredDue chan struct{}
	dedup      *hostlink.Deduper
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
	// out are the messages the host's reconciler answers this server
	// with, sent by the link's run loop.
	out chan *hostv1.HostMessage
}

func newServerLink(addr string, primary bool) *serverLink {
	return &serverLink{addr: addr, primary: primary, welcomed: make(chan struct{}), out: make(chan *hostv1.HostMessage, 64)}
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
		primary: newServerLink(o.Server, true), others: map[string]*serverLink{}, desiredDue: make(chan struct{}, 1),
		dedup: hostlink.NewDeduper(0)}
	h.loadServers()
	h.loadTerm()
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
	req := linkwire.JoinRequest{Token: h.o.JoinToken, CSR: csr}
	if h.creds != nil {
		req.Previous = h.creds.Current().Leaf.Raw
	}
	cfg := pki.HostJoinTLS(tok.Fingerprint)
	cfg.NextProtos = []string{linkwire.ALPNJoin, linkwire.ALPNHTTP1}
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
func (h *Host) post(ctx context.Context, cfg *tls.Config, addr, path, ctype string, body []byte) (*linkwire.JoinAnswer, error) {
	tr := &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: false, TLSHandshakeTimeout: linkwire.HandshakeTimeout}
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
		return nil, linkwire.HostError("server", resp.StatusCode, data)
	}
	var ans linkwire.JoinAnswer
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
	h.goLocked(ctx, h.reconcileDesired)
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
