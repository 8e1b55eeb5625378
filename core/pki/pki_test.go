// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pki

import (
	"bufio"
	"crypto"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// clock is a settable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Now().Truncate(time.Second)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// fixture is a server authority over a fresh CA, with a clock.
type fixture struct {
	clk   *clock
	dir   string
	ca    *CA
	store Store
	auth  *Authority
}

func newFixture(t *testing.T, store Store) *fixture {
	t.Helper()
	f := &fixture{clk: newClock(), dir: filepath.Join(t.TempDir(), "pki")}
	if store == nil {
		store = NewMemStore()
	}
	f.store = store
	ca, err := LoadOrCreateCA(f.dir, f.clk.Now)
	if err != nil {
		t.Fatalf("LoadOrCreateCA: %v", err)
	}
	f.ca = ca
	f.auth = f.newAuthority(t)
	return f
}

func (f *fixture) newAuthority(t *testing.T) *Authority {
	t.Helper()
	a, err := NewAuthority(AuthorityOptions{CA: f.ca, Store: f.store, ServerNames: []string{"localhost"},
		ServerIPs: []net.IP{net.ParseIP("127.0.0.1")}, Now: f.clk.Now})
	if err != nil {
		t.Fatalf("NewAuthority: %v", err)
	}
	return a
}

// enroll joins a host named name with a fresh token and returns its
// credentials.
func (f *fixture) enroll(t *testing.T, name string) (*Credentials, *Issued) {
	t.Helper()
	tok, err := f.auth.NewJoinToken(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	key, csr := newCSR(t, name)
	iss, err := f.auth.Enroll(EnrollRequest{Token: tok, CSR: csr})
	if err != nil {
		t.Fatalf("Enroll(%s): %v", name, err)
	}
	return NewCredentials(key, iss), iss
}

func newCSR(t *testing.T, name string) (crypto.Signer, []byte) {
	t.Helper()
	key, err := NewKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := NewCSR(key, name)
	if err != nil {
		t.Fatal(err)
	}
	return key, csr
}

// handshake runs one real TLS handshake over a loopback listener and one
// line each way. It returns the server's and the client's errors.
func handshake(t *testing.T, server, client *tls.Config) (serverErr, clientErr error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		raw, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		c := tls.Server(raw, server)
		defer c.Close()
		if err := c.Handshake(); err != nil {
			done <- err
			return
		}
		_, err = c.Write([]byte("ok\n"))
		done <- err
	}()
	c, err := tls.Dial("tcp", ln.Addr().String(), client)
	if err == nil {
		// TLS 1.3: the client finishes before the server has checked its
		// certificate; a refusal shows on the first read.
		var line string
		line, err = bufio.NewReader(c).ReadString('\n')
		if err == nil && line != "ok\n" {
			err = errors.New("unexpected " + line)
		}
		c.Close()
	}
	return <-done, err
}

// hostTLS is a host's config against f's server, with creds.
func (f *fixture) hostTLS(creds *Credentials) *tls.Config {
	c := HostTLS(f.ca.Certificate(), creds)
	c.Time = f.clk.Now // the server certificate is signed on the same clock
	return c
}

// ownerDir returns a new owner-only directory (t.TempDir's may be 0755).
func ownerDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestLoadOrCreateCA(t *testing.T) {
	clk := newClock()
	dir := filepath.Join(t.TempDir(), "pki")
	ca, err := LoadOrCreateCA(dir, clk.Now)
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]fs.FileMode{dir: 0o700, filepath.Join(dir, CACertFile): 0o600, filepath.Join(dir, CAKeyFile): 0o600} {
		st, err := os.Stat(path)
		if err != nil || st.Mode().Perm() != want {
			t.Fatalf("%s: %v %v, want mode %04o", path, st.Mode(), err, want)
		}
	}
	again, err := LoadOrCreateCA(dir, clk.Now)
	if err != nil {
		t.Fatalf("reload: %v", err)
	}
	if again.FingerprintHex() != ca.FingerprintHex() || len(ca.FingerprintHex()) != 64 {
		t.Fatalf("reloaded fingerprint %s, made %s", again.FingerprintHex(), ca.FingerprintHex())
	}
	sum := sha256.Sum256(ca.Certificate().Raw)
	if ca.Fingerprint() != sum {
		t.Fatal("the fingerprint is not the SHA-256 of the certificate's DER")
	}
	// The reloaded key signs certificates the first CA's pool verifies.
	f := &fixture{clk: clk, ca: again, store: NewMemStore()}
	f.auth = f.newAuthority(t)
	_, iss := f.enroll(t, "gpu-a")
	pool := x509.NewCertPool()
	pool.AddCert(ca.Certificate())
	if _, err := iss.Certificate.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: clk.Now(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("a certificate of the reloaded CA: %v", err)
	}
}

func TestLoadOrCreateCA_Refusals(t *testing.T) {
	other := filepath.Join(t.TempDir(), "other")
	if _, err := LoadOrCreateCA(other, nil); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		setup func(t *testing.T, dir string)
		want  string
	}{
		{name: "a directory others can read", setup: func(t *testing.T, dir string) { chmod(t, dir, 0o755) }, want: "mode 0755"},
		{name: "a key others can read", setup: func(t *testing.T, dir string) { chmod(t, filepath.Join(dir, CAKeyFile), 0o644) }, want: "mode 0644"},
		{name: "a certificate the group can read", setup: func(t *testing.T, dir string) { chmod(t, filepath.Join(dir, CACertFile), 0o640) }, want: "mode 0640"},
		{name: "a key alone", setup: func(t *testing.T, dir string) { remove(t, filepath.Join(dir, CACertFile)) }, want: "only one of"},
		{name: "a certificate alone", setup: func(t *testing.T, dir string) { remove(t, filepath.Join(dir, CAKeyFile)) }, want: "only one of"},
		{name: "another CA's key", setup: func(t *testing.T, dir string) {
			copyFile(t, filepath.Join(other, CAKeyFile), filepath.Join(dir, CAKeyFile))
		}, want: "does not match"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "pki")
			if _, err := LoadOrCreateCA(dir, nil); err != nil {
				t.Fatal(err)
			}
			c.setup(t, dir)
			_, err := LoadOrCreateCA(dir, nil)
			if !structs.HasCode(err, structs.CodeInvalidConfig) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want invalid_config with %q", err, c.want)
			}
		})
	}
}

func chmod(t *testing.T, path string, mode fs.FileMode) {
	t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func remove(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestAuthority_Enroll(t *testing.T) {
	cases := []struct {
		name string
		// run returns the enrolment's result; it may prepare the token.
		run      func(t *testing.T, f *fixture) (*Issued, error)
		wantCode structs.Code
		wantName string
	}{
		{name: "a good token for any host", wantName: "gpu-a", run: func(t *testing.T, f *fixture) (*Issued, error) {
			tok, _ := f.auth.NewJoinToken(time.Hour)
			_, csr := newCSR(t, "gpu-a")
			return f.auth.Enroll(EnrollRequest{Token: tok, CSR: csr})
		}},
		{name: "a good token for this host", wantName: "gpu-a", run: func(t *testing.T, f *fixture) (*Issued, error) {
			tok, _ := f.auth.NewJoinTokenFor("gpu-a", time.Hour)
			_, csr := newCSR(t, "gpu-a")
			return f.auth.Enroll(EnrollRequest{Token: tok, CSR: csr})
		}},
		{name: "a reused token", wantCode: structs.CodeJoinTokenUsed, run: func(t *testing.T, f *fixture) (*Issued, error) {
			tok, _ := f.auth.NewJoinToken(time.Hour)
			_, csr := newCSR(t, "gpu-a")
			if _, err := f.auth.Enroll(EnrollRequest{Token: tok, CSR: csr}); err != nil {
				t.Fatal(err)
			}
			_, csr = newCSR(t, "gpu-b")
			return f.auth.Enroll(EnrollRequest{Token: tok, CSR: csr})
		}},
		{name: "an expired token", wantCode: structs.CodeJoinTokenExpired, run: func(t *testing.T, f *fixture) (*Issued, error) {
			tok, _ := f.auth.NewJoinToken(time.Hour)
			f.clk.Add(time.Hour)
			_, csr := newCSR(t, "gpu-a")
			return f.auth.Enroll(EnrollRequest{Token: tok, CSR: csr})
		}},
		{name: "a token this server never issued", wantCode: structs.CodeJoinTokenInvalid, run: func(t *testing.T, f *fixture) (*Issued, error) {
			tok, _ := newJoinToken(f.ca.Fingerprint())
			_, csr := newCSR(t, "gpu-a")
			return f.auth.Enroll(EnrollRequest{Token: tok.String(), CSR: csr})
		}},
		{name: "a token of another server's CA", wantCode: structs.CodeJoinTokenInvalid, run: func(t *testing.T, f *fixture) (*Issued, error) {
			tok, _ := f.auth.NewJoinToken(time.Hour)
			parsed, _ := ParseJoinToken(tok)
			parsed.Fingerprint[0] ^= 0xff
			_, csr := newCSR(t, "gpu-a")
			return f.auth.Enroll(EnrollRequest{Token: parsed.String(), CSR: csr})
		}},
		{name: "a malformed token", wantCode: structs.CodeJoinTokenInvalid, run: func(t *testing.T, f *fixture) (*Issued, error) {
			_, csr := newCSR(t, "gpu-a")
			return f.auth.Enroll(EnrollRequest{Token: "capyjoin1.nothex.x", CSR: csr})
		}},
		{name: "a CSR for another name than the token's", wantCode: structs.CodeHostNameChanged, run: func(t *testing.T, f *fixture) (*Issued, error) {
			tok, _ := f.auth.NewJoinTokenFor("gpu-a", time.Hour)
			_, csr := newCSR(t, "gpu-b")
			return f.auth.Enroll(EnrollRequest{Token: tok, CSR: csr})
		}},
		{name: "a host whose name changed from its previous certificate", wantCode: structs.CodeHostNameChanged, run: func(t *testing.T, f *fixture) (*Issued, error) {
			_, prev := f.enroll(t, "gpu-a")
			f.clk.Add(48 * time.Hour) // the old certificate expired: it still names the host
			tok, _ := f.auth.NewJoinToken(time.Hour)
			_, csr := newCSR(t, "gpu-b")
			return f.auth.Enroll(EnrollRequest{Token: tok, CSR: csr, Previous: prev.Certificate.Raw})
		}},
		{name: "a host joining again under its name", wantName: "gpu-a", run: func(t *testing.T, f *fixture) (*Issued, error) {
			_, prev := f.enroll(t, "gpu-a")
			tok, _ := f.auth.NewJoinToken(time.Hour)
			_, csr := newCSR(t, "gpu-a")
			return f.auth.Enroll(EnrollRequest{Token: tok, CSR: csr, Previous: prev.Certificate.Raw})
		}},
		{name: "a CSR that does not parse", wantCode: structs.CodeInvalidRequest, run: func(t *testing.T, f *fixture) (*Issued, error) {
			tok, _ := f.auth.NewJoinToken(time.Hour)
			return f.auth.Enroll(EnrollRequest{Token: tok, CSR: []byte("nope")})
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, nil)
			iss, err := c.run(t, f)
			if c.wantCode != "" {
				if !structs.HasCode(err, c.wantCode) {
					t.Fatalf("got %v (%s), want %s", err, structs.CodeOf(err), c.wantCode)
				}
				return
			}
			if err != nil {
				t.Fatalf("Enroll: %v", err)
			}
			cert := iss.Certificate
			if cert.Subject.CommonName != c.wantName || len(cert.DNSNames) != 1 || cert.DNSNames[0] != c.wantName {
				t.Fatalf("issued CN %q SAN %v, want %q", cert.Subject.CommonName, cert.DNSNames, c.wantName)
			}
			if got := cert.NotAfter.Sub(f.clk.Now()); got != DefaultHostCertLifetime {
				t.Fatalf("lifetime %s, want %s", got, DefaultHostCertLifetime)
			}
			if len(cert.ExtKeyUsage) != 1 || cert.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth || cert.IsCA {
				t.Fatalf("usage %v, CA %v", cert.ExtKeyUsage, cert.IsCA)
			}
		})
	}
}

func TestAuthority_HostCertLifetime(t *testing.T) {
	f := newFixture(t, nil)
	a, err := NewAuthority(AuthorityOptions{CA: f.ca, Store: f.store, ServerNames: []string{"localhost"}, HostCertLifetime: time.Hour, Now: f.clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	f.auth = a
	_, iss := f.enroll(t, "gpu-a")
	if got := iss.Certificate.NotAfter.Sub(f.clk.Now()); got != time.Hour {
		t.Fatalf("lifetime %s, want 1h", got)
	}
}

func TestStore_RedeemOnce(t *testing.T) {
	dir := ownerDir(t)
	fileStore, err := NewFileStore(filepath.Join(dir, "tokens.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		store Store
	}{{"memory", NewMemStore()}, {"file", fileStore}} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, c.store)
			tok, err := f.auth.NewJoinToken(time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			const n = 16
			_, csr := newCSR(t, "gpu-a")
			errs := make(chan error, n)
			var wg sync.WaitGroup
			for i := 0; i < n; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := f.auth.Enroll(EnrollRequest{Token: tok, CSR: csr})
					errs <- err
				}()
			}
			wg.Wait()
			close(errs)
			ok, used := 0, 0
			for err := range errs {
				switch {
				case err == nil:
					ok++
				case structs.HasCode(err, structs.CodeJoinTokenUsed):
					used++
				default:
					t.Errorf("unexpected %v", err)
				}
			}
			if ok != 1 || used != n-1 {
				t.Fatalf("%d joined and %d were refused as used, want 1 and %d", ok, used, n-1)
			}
		})
	}
}

func TestFileStore_SurvivesReload(t *testing.T) {
	dir := ownerDir(t)
	path := filepath.Join(dir, "tokens.json")
	store, err := NewFileStore(path)
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, store)
	tok, _ := f.auth.NewJoinToken(time.Hour)
	creds, _ := f.enroll(t, "gpu-a")
	f.clk.Add(time.Second)
	if err := f.auth.Revoke("gpu-a"); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("%s: %v %v, want 0600", path, st, err)
	}
	// A restart: a new store over the file, a new authority over it.
	f.store, err = NewFileStore(path)
	if err != nil {
		t.Fatal(err)
	}
	f.auth = f.newAuthority(t)
	_, csr := newCSR(t, "gpu-b")
	if _, err := f.auth.Enroll(EnrollRequest{Token: tok, CSR: csr}); err != nil {
		t.Fatalf("a token made before the restart: %v", err)
	}
	if _, err := f.auth.Enroll(EnrollRequest{Token: tok, CSR: csr}); !structs.HasCode(err, structs.CodeJoinTokenUsed) {
		t.Fatalf("the token again after the restart: %v, want join_token_used", err)
	}
	if serverErr, _ := handshake(t, f.auth.ServerTLS(), f.hostTLS(creds)); !structs.HasCode(serverErr, structs.CodeHostRevoked) {
		t.Fatalf("a host revoked before the restart: %v, want host_revoked", serverErr)
	}
}

func TestServerTLS_Handshake(t *testing.T) {
	cases := []struct {
		name string
		// client returns the host's config against f's server.
		client func(t *testing.T, f *fixture) *tls.Config
		// wantServer is a substring of the server's error, or a code; ""
		// for a good host.
		wantServer string
		wantCode   structs.Code
	}{
		{name: "a good host", client: func(t *testing.T, f *fixture) *tls.Config {
			creds, _ := f.enroll(t, "gpu-a")
			return f.hostTLS(creds)
		}},
		{name: "no client certificate", wantServer: "didn't provide a certificate", client: func(t *testing.T, f *fixture) *tls.Config {
			return f.hostTLS(nil)
		}},
		{name: "a certificate of another CA", wantServer: "unknown authority", client: func(t *testing.T, f *fixture) *tls.Config {
			other := newFixture(t, nil)
			creds, _ := other.enroll(t, "gpu-a")
			return f.hostTLS(creds)
		}},
		{name: "an expired certificate", wantServer: "expired", client: func(t *testing.T, f *fixture) *tls.Config {
			key, csr := newCSR(t, "gpu-a")
			req, _ := x509.ParseCertificateRequest(csr)
			now := f.clk.Now()
			cert, err := f.ca.sign(leafOptions{commonName: "gpu-a", dnsNames: []string{"gpu-a"}, usage: x509.ExtKeyUsageClientAuth,
				notBefore: now.Add(-48 * time.Hour), notAfter: now.Add(-24 * time.Hour), pub: req.PublicKey})
			if err != nil {
				t.Fatal(err)
			}
			return f.hostTLS(NewCredentials(key, &Issued{Certificate: cert}))
		}},
		{name: "a certificate that expired while the clock ran", wantServer: "expired", client: func(t *testing.T, f *fixture) *tls.Config {
			creds, _ := f.enroll(t, "gpu-a")
			f.clk.Add(DefaultHostCertLifetime + time.Second)
			return f.hostTLS(creds)
		}},
		{name: "a revoked certificate", wantCode: structs.CodeHostRevoked, client: func(t *testing.T, f *fixture) *tls.Config {
			creds, _ := f.enroll(t, "gpu-a")
			if err := f.auth.Revoke("gpu-a"); err != nil {
				t.Fatal(err)
			}
			return f.hostTLS(creds)
		}},
		{name: "a certificate issued after a revocation", client: func(t *testing.T, f *fixture) *tls.Config {
			f.enroll(t, "gpu-a")
			if err := f.auth.Revoke("gpu-a"); err != nil {
				t.Fatal(err)
			}
			f.clk.Add(time.Second)
			creds, _ := f.enroll(t, "gpu-a")
			return f.hostTLS(creds)
		}},
		{name: "another host stays when one is revoked", client: func(t *testing.T, f *fixture) *tls.Config {
			f.enroll(t, "gpu-a")
			creds, _ := f.enroll(t, "gpu-b")
			if err := f.auth.Revoke("gpu-a"); err != nil {
				t.Fatal(err)
			}
			return f.hostTLS(creds)
		}},
		{name: "a TLS 1.2 client", wantServer: "unsupported versions", client: func(t *testing.T, f *fixture) *tls.Config {
			creds, _ := f.enroll(t, "gpu-a")
			c := f.hostTLS(creds)
			c.MinVersion, c.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
			return c
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, nil)
			client := c.client(t, f)
			serverErr, clientErr := handshake(t, f.auth.ServerTLS(), client)
			if c.wantServer == "" && c.wantCode == "" {
				if serverErr != nil || clientErr != nil {
					t.Fatalf("server: %v, client: %v", serverErr, clientErr)
				}
				return
			}
			if serverErr == nil || clientErr == nil {
				t.Fatalf("the handshake passed (server: %v, client: %v)", serverErr, clientErr)
			}
			if c.wantCode != "" && !structs.HasCode(serverErr, c.wantCode) {
				t.Fatalf("server: %v, want %s", serverErr, c.wantCode)
			}
			if c.wantServer != "" && !strings.Contains(serverErr.Error(), c.wantServer) {
				t.Fatalf("server: %v, want %q", serverErr, c.wantServer)
			}
		})
	}
}

// TestFileStore_KeepsOnlyTheHash: the server's file holds the secret's hash,
// never the token or its secret.
func TestFileStore_KeepsOnlyTheHash(t *testing.T) {
	path := filepath.Join(ownerDir(t), "tokens.json")
	store, err := NewFileStore(path)
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, store)
	tok, err := f.auth.NewJoinTokenFor("gpu-a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	parsed, _ := ParseJoinToken(tok)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	secret := strings.Split(tok, ".")[2]
	if strings.Contains(string(data), secret) || !strings.Contains(string(data), parsed.secretHash()) {
		t.Fatalf("the store holds %s", data)
	}
}
