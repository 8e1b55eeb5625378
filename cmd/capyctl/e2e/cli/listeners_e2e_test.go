// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package cli_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// selfSigned writes a self-signed certificate for 127.0.0.1 and its key
// into dir; it returns their paths and the certificate.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, cert *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "capyctl test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ = x509.ParseCertificate(der)
	return certFile, keyFile, cert
}

// TestListeners_PlainOffLoopbackWarns: an inference endpoint on every
// address without TLS is warned about at start and in capyctl status.
func TestListeners_PlainOffLoopbackWarns(t *testing.T) {
	t.Parallel()
	r := harness.StartStandalone(t, harness.Options{Args: []string{"--listen", "0.0.0.0:0"}})
	if !strings.Contains(r.Output(), "without TLS") {
		t.Fatalf("no warning at start:\n%s", r.Output())
	}
	out, _, code := r.CLI("status")
	want(t, "status", code, 0, out, "Inference:   http://", "Warning:     the inference endpoint listens on 0.0.0.0:0 without TLS")
}

// TestListeners_TLS: with tls set, the role serves its inference endpoint
// over TLS, status says https and warns of nothing.
func TestListeners_TLS(t *testing.T) {
	t.Parallel()
	certFile, keyFile, cert := selfSigned(t, t.TempDir())
	r := harness.StartStandalone(t, harness.Options{Args: []string{"--listen", "0.0.0.0:0",
		"--set", "tls.cert_file=" + certFile, "--set", "tls.key_file=" + keyFile}})
	out, _, code := r.CLI("status")
	want(t, "status", code, 0, out, "Inference:   https://")
	if strings.Contains(out, "Warning:") || strings.Contains(r.Output(), "without TLS") {
		t.Fatalf("a TLS endpoint warned about:\n%s\n%s", out, r.Output())
	}
	_, port, _ := net.SplitHostPort(r.Info.Inference)
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	cl := &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	req, _ := http.NewRequest(http.MethodGet, "https://127.0.0.1:"+port+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer "+r.Creds.APIKey)
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET /v1/models over TLS: %d", resp.StatusCode)
	}
}
