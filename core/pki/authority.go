// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pki

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"regexp"
	"sync"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// DefaultHostCertLifetime is a host certificate's validity unless
// AuthorityOptions says otherwise. Short, because revocation is a set the
// server checks, not a list hosts fetch: an expired certificate needs no
// list at all.
const DefaultHostCertLifetime = 24 * time.Hour

// serverCertLifetime is the server certificate's validity; the Authority
// signs a new one when two thirds of it have passed.
const serverCertLifetime = 30 * 24 * time.Hour

// AuthorityOptions configure an Authority.
type AuthorityOptions struct {
	// CA signs host and server certificates.
	CA *CA
	// Store keeps join tokens and revocations.
	Store Store
	// ServerNames and ServerIPs go in the server certificate's SAN: the
	// names and addresses hosts dial.
	ServerNames []string
	ServerIPs   []net.IP
	// HostCertLifetime is a host certificate's validity (0: 24 h).
	HostCertLifetime time.Duration
	// Member reports whether a host name belongs to a joined host (nil:
	// none does). A token not bound to that name cannot enrol it: whoever
	// holds some other host's token must not take over a member's name.
	Member func(name string) bool
	// Now is the clock (nil: time.Now); TLS verification uses it too.
	Now func() time.Time
	// Revoked, when set, is where the revocations are read at every
	// handshake and renewal (a cluster's replicated state): Store's
	// Revocations and Revoke are then not used.
	Revoked func(hostName string) (at time.Time, revoked bool)
}

// Authority is the server's side: it issues join tokens, enrols and renews
// hosts, revokes them, and builds the server's tls.Configs.
type Authority struct {
	ca       *CA
	store    Store
	names    []string
	ips      []net.IP
	lifetime time.Duration
	now      func() time.Time
	member   func(string) bool
	lookup   func(string) (time.Time, bool)

	mu         sync.RWMutex
	revoked    map[string]time.Time
	serverCert *tls.Certificate
}

// NewAuthority returns an Authority with the revocations its store holds.
func NewAuthority(o AuthorityOptions) (*Authority, error) {
	if o.CA == nil || o.Store == nil {
		return nil, fmt.Errorf("pki: an authority needs a CA and a store")
	}
	if len(o.ServerNames) == 0 && len(o.ServerIPs) == 0 {
		return nil, structs.Errf(structs.CodeInvalidConfig, "the server certificate needs at least one name or address hosts dial")
	}
	a := &Authority{
		ca:       o.CA,
		store:    o.Store,
		names:    o.ServerNames,
		ips:      o.ServerIPs,
		lifetime: o.HostCertLifetime,
		now:      o.Now,
		member:   o.Member,
		lookup:   o.Revoked,
	}
	if a.lifetime <= 0 {
		a.lifetime = DefaultHostCertLifetime
	}
	if a.now == nil {
		a.now = time.Now
	}
	if a.lookup != nil {
		return a, nil
	}
	revoked, err := o.Store.Revocations()
	if err != nil {
		return nil, fmt.Errorf("read the revocations: %w", err)
	}
	a.revoked = revoked
	return a, nil
}

// CA returns the authority's CA.
func (a *Authority) CA() *CA { return a.ca }

// NewJoinToken returns a one-time join token for any host name, valid for
// ttl.
func (a *Authority) NewJoinToken(ttl time.Duration) (string, error) {
	return a.NewJoinTokenFor("", ttl)
}

// NewJoinTokenFor returns a one-time join token valid for ttl that only a
// host named hostName can redeem ("" for any).
func (a *Authority) NewJoinTokenFor(hostName string, ttl time.Duration) (string, error) {
	if ttl <= 0 {
		return "", structs.Errf(structs.CodeInvalidRequest, "a join token's time to live must be positive, not %s", ttl)
	}
	if hostName != "" {
		if err := checkHostName(hostName); err != nil {
			return "", err
		}
	}
	t, err := newJoinToken(a.ca.Fingerprint())
	if err != nil {
		return "", err
	}
	rec := TokenRecord{Hash: t.secretHash(), HostName: hostName, Expires: a.now().Add(ttl)}
	if err := a.store.PutToken(rec); err != nil {
		return "", fmt.Errorf("record the join token: %w", err)
	}
	return t.String(), nil
}

// hostNameRE is a DNS name in lowercase: what a host certificate may name.
var hostNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$`)

func checkHostName(name string) error {
	if len(name) > 253 || !hostNameRE.MatchString(name) {
		return structs.Errf(structs.CodeInvalidRequest, "%q is not a host name (lowercase letters, digits, '-' and '.')", name)
	}
	return nil
}

// EnrollRequest is what a joining host sends.
type EnrollRequest struct {
	// Token is the join token as the operator gave it.
	Token string
	// CSR is the DER of the host's certificate request; its common name is
	// the host name.
	CSR []byte
	// Previous is the DER of the host's last certificate from this CA, if it
	// had one (a host joining again with a new token). Its name must match.
	Previous []byte
}

// Issued is a signed host certificate.
type Issued struct {
	// Certificate is the host certificate (its DER in Raw).
	Certificate *x509.Certificate
	// CA is the DER of the CA certificate, to pin against the token's
	// fingerprint (PinCA).
	CA []byte
}

// Enroll redeems the join token and signs a host certificate for the CSR's
// host name. Refusals: join_token_invalid (malformed, another server's,
// unknown), join_token_used, join_token_expired, host_name_changed (a name
// other than the token's, or than the previous certificate's),
// invalid_request (a bad CSR).
//
// IMPORTANT: the CSR is checked before the token is redeemed, so a host
// that sends a malformed request keeps its token; a name refusal redeems
// it (the token was shown to a host it was not meant for).
func (a *Authority) Enroll(req EnrollRequest) (*Issued, error) {
	t, err := ParseJoinToken(req.Token)
	if err != nil {
		return nil, err
	}
	if t.Fingerprint != a.ca.Fingerprint() {
		return nil, structs.Errf(structs.CodeJoinTokenInvalid, "the join token names another server's CA")
	}
	csr, name, err := parseCSR(req.CSR)
	if err != nil {
		return nil, err
	}
	var previous *x509.Certificate
	if len(req.Previous) > 0 {
		if previous, err = a.verifyPrevious(req.Previous); err != nil {
			return nil, err
		}
	}
	now := a.now()
	rec, found, err := a.store.RedeemToken(t.secretHash(), "", now)
	switch {
	case err != nil:
		return nil, fmt.Errorf("redeem the join token: %w", err)
	case !found:
		return nil, structs.Errf(structs.CodeJoinTokenInvalid, "this server never issued the join token")
	case rec.Role == TokenRoleServer: // not redeemed: the server it was made for can still join with it
		return nil, structs.Errf(structs.CodeJoinTokenInvalid, "the join token joins a server, not a host (capyctl create join-token makes a host's)")
	case !rec.Used.IsZero():
		return nil, structs.Errf(structs.CodeJoinTokenUsed, "the join token was redeemed at %s; create a new one", rec.Used.UTC().Format(time.RFC3339))
	case !now.Before(rec.Expires):
		return nil, structs.Errf(structs.CodeJoinTokenExpired, "the join token expired at %s; create a new one", rec.Expires.UTC().Format(time.RFC3339))
	case rec.HostName != "" && rec.HostName != name:
		return nil, structs.Errf(structs.CodeHostNameChanged, "the join token is for host %q, the request names %q", rec.HostName, name).
			WithDetail("token_host", rec.HostName).WithDetail("host", name)
	case a.member != nil && a.member(name) && rec.HostName != name:
		return nil, structs.Errf(structs.CodeConflict, "host %q has joined already: a token made for it (capyctl create join-token --host %s) joins it again; remove it first to give its name to another machine", name, name).
			WithDetail("host", name)
	case previous != nil && previous.Subject.CommonName != name:
		return nil, structs.Errf(structs.CodeHostNameChanged, "this host joined as %q and now names itself %q; remove the old host or restore its name", previous.Subject.CommonName, name).
			WithDetail("previous", previous.Subject.CommonName).WithDetail("host", name)
	}
	return a.issueHost(name, csr, now)
}

// verifyPrevious checks that der is a host certificate this CA signed; its
// expiry does not matter (a host that was away for days joins again).
func (a *Authority) verifyPrevious(der []byte) (*x509.Certificate, error) {
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, structs.Wrap(structs.CodeInvalidRequest, err, "parse the previous certificate")
	}
	if err := cert.CheckSignatureFrom(a.ca.cert); err != nil {
		return nil, structs.Wrap(structs.CodeInvalidRequest, err, "the previous certificate is not from this server's CA")
	}
	return cert, nil
}

// parseCSR parses and checks a host's CSR: a valid signature and one host
// name, in the common name and, if any, the only DNS SAN.
func parseCSR(der []byte) (*x509.CertificateRequest, string, error) {
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, "", structs.Wrap(structs.CodeInvalidRequest, err, "parse the certificate request")
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, "", structs.Wrap(structs.CodeInvalidRequest, err, "the certificate request's signature")
	}
	name := csr.Subject.CommonName
	if err := checkHostName(name); err != nil {
		return nil, "", err
	}
	if len(csr.DNSNames) > 1 || (len(csr.DNSNames) == 1 && csr.DNSNames[0] != name) ||
		len(csr.IPAddresses) > 0 || len(csr.URIs) > 0 || len(csr.EmailAddresses) > 0 {
		return nil, "", structs.Errf(structs.CodeInvalidRequest, "a host certificate request names its host name only (common name %q)", name)
	}
	return csr, name, nil
}

func (a *Authority) issueHost(name string, csr *x509.CertificateRequest, now time.Time) (*Issued, error) {
	// NotBefore is now, to the second (x509 keeps seconds): the revocation
	// check compares it with the revocation time. Only the server checks a
	// host certificate, with the clock that signed it, so no back-dating
	// for skew is needed.
	cert, err := a.ca.sign(leafOptions{
		commonName: name,
		dnsNames:   []string{name},
		usage:      x509.ExtKeyUsageClientAuth,
		notBefore:  now.Truncate(time.Second),
		notAfter:   now.Add(a.lifetime),
		pub:        csr.PublicKey,
	})
	if err != nil {
		return nil, err
	}
	return &Issued{Certificate: cert, CA: a.ca.cert.Raw}, nil
}

// Renew signs a new certificate for the host on the other end of a mutual
// TLS connection (state), from a CSR for the same host name. The peer's
// certificate must be verified by this CA, unexpired and not revoked now;
// a CSR for another name is host_name_changed.
func (a *Authority) Renew(state tls.ConnectionState, csrDER []byte) (*Issued, error) {
	if len(state.VerifiedChains) == 0 || len(state.VerifiedChains[0]) == 0 {
		return nil, structs.Errf(structs.CodeUnauthorized, "renewal needs a connection with a verified host certificate")
	}
	peer := state.VerifiedChains[0][0]
	now := a.now()
	if err := a.checkHost(peer, now); err != nil {
		return nil, err
	}
	csr, name, err := parseCSR(csrDER)
	if err != nil {
		return nil, err
	}
	if name != peer.Subject.CommonName {
		return nil, structs.Errf(structs.CodeHostNameChanged, "this host holds a certificate for %q and asks for one for %q", peer.Subject.CommonName, name).
			WithDetail("previous", peer.Subject.CommonName).WithDetail("host", name)
	}
	return a.issueHost(name, csr, now)
}

// checkHost checks a host certificate the TLS stack verified: still valid
// at now (a long-lived connection outlives its certificate), one name,
// not revoked.
func (a *Authority) checkHost(cert *x509.Certificate, now time.Time) error {
	if err := cert.CheckSignatureFrom(a.ca.cert); err != nil {
		return structs.Wrap(structs.CodeUnauthorized, err, "the host certificate is not from this server's CA")
	}
	if now.After(cert.NotAfter) || now.Before(cert.NotBefore) {
		return structs.Errf(structs.CodeUnauthorized, "the host certificate of %q is valid from %s to %s, not now; join again with a new token",
			cert.Subject.CommonName, cert.NotBefore.UTC().Format(time.RFC3339), cert.NotAfter.UTC().Format(time.RFC3339))
	}
	name := cert.Subject.CommonName
	if hasUsage(cert, x509.ExtKeyUsageServerAuth) {
		// A server peer's certificate (IssueServerPeer) also says
		// ClientAuth; it is a server's, never a host's.
		return structs.Errf(structs.CodeUnauthorized, "the certificate of %q is a server's, not a host's", name)
	}
	if len(cert.DNSNames) != 1 || cert.DNSNames[0] != name {
		return structs.Errf(structs.CodeUnauthorized, "the host certificate of %q does not name its host in its SAN", name)
	}
	at, revoked := a.revocation(name)
	if revoked && !cert.NotBefore.After(at) {
		return structs.Errf(structs.CodeHostRevoked, "host %q was removed at %s", name, at.UTC().Format(time.RFC3339)).WithDetail("host", name)
	}
	return nil
}

// revocation is when a host's certificates were revoked, if they were.
func (a *Authority) revocation(name string) (time.Time, bool) {
	if a.lookup != nil {
		return a.lookup(name)
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	at, revoked := a.revoked[name]
	return at, revoked
}

// Revoke refuses every certificate issued to hostName so far, from the
// next handshake on. A connection already open is not closed here: the
// caller that owns it closes it. A later join with a new token issues a
// certificate that is not revoked. The revocation is stored before it
// takes effect, so a restart keeps it.
func (a *Authority) Revoke(hostName string) error {
	// A certificate is revoked when its NotBefore (whole seconds) is not
	// after the revocation time (whole seconds too). A certificate signed
	// in the same second as the revocation is revoked with the others; its
	// host joins again a second later.
	at := a.now().Truncate(time.Second)
	if err := a.store.PutRevocation(hostName, at); err != nil {
		return fmt.Errorf("record the revocation of %q: %w", hostName, err)
	}
	a.mu.Lock()
	a.revoked[hostName] = at
	a.mu.Unlock()
	return nil
}

// serverCertificate returns the server's certificate, signing a new one
// when none is held or two thirds of its life have passed.
func (a *Authority) serverCertificate() (*tls.Certificate, error) {
	now := a.now()
	a.mu.RLock()
	c := a.serverCert
	a.mu.RUnlock()
	if c != nil && now.Before(RenewAt(c.Leaf)) {
		return c, nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.serverCert != nil && now.Before(RenewAt(a.serverCert.Leaf)) {
		return a.serverCert, nil
	}
	key, err := NewKey()
	if err != nil {
		return nil, err
	}
	cn := "capyctl-server"
	if len(a.names) > 0 {
		cn = a.names[0]
	}
	leaf, err := a.ca.sign(leafOptions{
		commonName: cn,
		dnsNames:   a.names,
		ips:        a.ips,
		usage:      x509.ExtKeyUsageServerAuth,
		// Hosts check the server certificate with their own clocks.
		notBefore: now.Add(-time.Hour),
		notAfter:  now.Add(serverCertLifetime),
		pub:       key.Public(),
	})
	if err != nil {
		return nil, err
	}
	// IMPORTANT: the chain carries the CA certificate: a joining host pins
	// it by fingerprint from this chain (HostJoinTLS).
	a.serverCert = &tls.Certificate{Certificate: [][]byte{leaf.Raw, a.ca.cert.Raw}, PrivateKey: key, Leaf: leaf}
	return a.serverCert, nil
}

// ServerTLS returns the config of the server's host listener: TLS 1.3,
// a client certificate required and verified against the CA, and every
// handshake checked against the revocation set.
//
// IMPORTANT: the revocation check is in VerifyConnection, which Go runs on
// every handshake (VerifyPeerCertificate is skipped on resumption); session
// tickets are off as well, so each connection shows its certificate.
func (a *Authority) ServerTLS() *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(a.ca.cert)
	return &tls.Config{
		MinVersion:             tls.VersionTLS13,
		ClientAuth:             tls.RequireAndVerifyClientCert,
		ClientCAs:              pool,
		SessionTicketsDisabled: true,
		Time:                   a.now,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return a.serverCertificate()
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
				return structs.Errf(structs.CodeUnauthorized, "no verified host certificate")
			}
			return a.checkHost(cs.VerifiedChains[0][0], a.now())
		},
	}
}

// JoinServerTLS returns the config of the server's join listener: TLS 1.3
// and the server certificate, with no client certificate (a joining host
// has none yet: its join token authenticates it). IMPORTANT: serve Enroll
// only on it, nothing else.
func (a *Authority) JoinServerTLS() *tls.Config {
	return &tls.Config{
		MinVersion:             tls.VersionTLS13,
		ClientAuth:             tls.NoClientCert,
		SessionTicketsDisabled: true,
		Time:                   a.now,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return a.serverCertificate()
		},
	}
}
