// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// testCA is a certificate authority made for a test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a PEM certificate and key named cn, for a server
// (127.0.0.1) or a client.
func (ca *testCA) issue(t *testing.T, cn string, serial int64, client bool) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature,
	}
	if client {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// writeFile replaces a file the way a renewal does: a new file renamed
// over the old one.
func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// tlsGet sends one request on an open TLS connection and returns the
// status.
func tlsGet(t *testing.T, c *tls.Conn, br *bufio.Reader) int {
	t.Helper()
	fmt.Fprintf(c, "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", testKey)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("request on an open connection: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func TestTLSListener_ServesAndReloads(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, "test ca")
	files := TLSFiles{CertFile: filepath.Join(dir, "cert.pem"), KeyFile: filepath.Join(dir, "key.pem")}
	cert, key := ca.issue(t, "first", 10, false)
	writeFile(t, files.CertFile, cert)
	writeFile(t, files.KeyFile, key)
	s := serveTest(t, inferenceAuth(okHandler, testKey), ListenerOptions{}, files)

	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	dialTLS := func() (*tls.Conn, *bufio.Reader, string) {
		c, err := tls.Dial("tcp", s.addr, &tls.Config{RootCAs: roots})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(time.Minute))
		return c, bufio.NewReader(c), c.ConnectionState().PeerCertificates[0].Subject.CommonName
	}
	old, oldBR, cn := dialTLS()
	if cn != "first" || tlsGet(t, old, oldBR) != 200 {
		t.Fatalf("first connection: certificate %q", cn)
	}
	// A plain HTTP client gets no answer in clear.
	if resp, err := http.Get("http://" + s.addr + "/v1/models"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("plain HTTP served on a TLS listener")
		}
	}

	// The certificate is renewed: a new connection gets the new one, the
	// open connection goes on.
	cert, key = ca.issue(t, "second", 11, false)
	writeFile(t, files.KeyFile, key)
	writeFile(t, files.CertFile, cert)
	fresh, freshBR, cn := dialTLS()
	if cn != "second" {
		t.Fatalf("a new connection after the renewal got certificate %q, want second", cn)
	}
	if tlsGet(t, fresh, freshBR) != 200 {
		t.Fatal("new connection not served")
	}
	if tlsGet(t, old, oldBR) != 200 {
		t.Fatal("the connection opened before the renewal was not served")
	}

	// A broken renewal (a key that does not match) keeps the last good
	// certificate.
	_, otherKey := ca.issue(t, "third", 12, false)
	writeFile(t, files.KeyFile, otherKey)
	if _, _, cn := dialTLS(); cn != "second" {
		t.Fatalf("after a broken renewal: certificate %q, want the last good one (second)", cn)
	}
}

func TestTLSListener_ClientCertificates(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, "server ca")
	clientCA := newTestCA(t, "client ca")
	files := TLSFiles{
		CertFile: filepath.Join(dir, "cert.pem"), KeyFile: filepath.Join(dir, "key.pem"),
		ClientCAFile: filepath.Join(dir, "clients.pem"),
	}
	cert, key := ca.issue(t, "server", 10, false)
	writeFile(t, files.CertFile, cert)
	writeFile(t, files.KeyFile, key)
	writeFile(t, files.ClientCAFile, clientCA.pem)
	s := serveTest(t, inferenceAuth(okHandler, testKey), ListenerOptions{}, files)
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)

	good, goodKey := clientCA.issue(t, "app", 20, true)
	goodPair, err := tls.X509KeyPair(good, goodKey)
	if err != nil {
		t.Fatal(err)
	}
	stranger, strangerKey := newTestCA(t, "another ca").issue(t, "stranger", 21, true)
	strangerPair, err := tls.X509KeyPair(stranger, strangerKey)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		certs []tls.Certificate
		ok    bool
	}{
		{"no client certificate", nil, false},
		{"a certificate of another CA", []tls.Certificate{strangerPair}, false},
		{"a certificate of the client CA", []tls.Certificate{goodPair}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: c.certs}}
			defer tr.CloseIdleConnections()
			req, _ := http.NewRequest(http.MethodGet, "https://"+s.addr+"/v1/models", nil)
			req.Header.Set("Authorization", "Bearer "+testKey)
			resp, err := (&http.Client{Transport: tr, Timeout: time.Minute}).Do(req)
			if err == nil {
				resp.Body.Close()
			}
			if got := err == nil && resp.StatusCode == 200; got != c.ok {
				t.Fatalf("served %v (error %v), want %v", got, err, c.ok)
			}
		})
	}
}

func TestTLSListener_RefusesMissingFiles(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dir := t.TempDir()
	if _, err := TLSListener(ln, TLSFiles{CertFile: filepath.Join(dir, "no.pem"), KeyFile: filepath.Join(dir, "no.key")}, nil); err == nil {
		t.Fatal("a TLS listener without its files")
	}
}

func TestPlainListenerWarning(t *testing.T) {
	cases := []struct {
		listen string
		tls    bool
		warn   bool
	}{
		{"0.0.0.0:8443", false, true},
		{":8443", false, true},
		{"[::]:8443", false, true},
		{"10.1.2.3:8443", false, true},
		{"0.0.0.0:8443", true, false},
		{"127.0.0.1:8443", false, false},
		{"[::1]:8443", false, false},
		{"localhost:8443", false, false},
	}
	for _, c := range cases {
		if got := PlainListenerWarning(c.listen, c.tls) != ""; got != c.warn {
			t.Errorf("PlainListenerWarning(%q, tls %v) warns %v, want %v", c.listen, c.tls, got, c.warn)
		}
	}
}
