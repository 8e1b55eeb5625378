// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pki

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// serve runs an HTTP server with cfg on a loopback listener until the test
// ends and returns its base URL. Its two routes stand in for the server
// role's join and renew calls: they are the next session's to define.
func serve(t *testing.T, f *fixture, cfg *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /join", func(w http.ResponseWriter, r *http.Request) {
		var req EnrollRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		iss, err := f.auth.Enroll(req)
		answer(w, iss, err)
	})
	mux.HandleFunc("POST /renew", func(w http.ResponseWriter, r *http.Request) {
		csr, _ := io.ReadAll(r.Body)
		iss, err := f.auth.Renew(*r.TLS, csr)
		answer(w, iss, err)
	})
	// Refused handshakes are the tests' point: keep them off the output.
	srv := &http.Server{Handler: mux, ErrorLog: log.New(io.Discard, "", 0)}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "https://" + ln.Addr().String()
}

func answer(w http.ResponseWriter, iss *Issued, err error) {
	if err != nil {
		w.WriteHeader(http.StatusForbidden)
		json.NewEncoder(w).Encode(structs.AsError(err))
		return
	}
	json.NewEncoder(w).Encode(map[string][]byte{"cert": iss.Certificate.Raw, "ca": iss.CA})
}

// post sends body over a fresh connection with cfg and decodes the answer.
func post(t *testing.T, cfg *tls.Config, url string, body []byte) (cert, ca []byte, err error) {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
	resp, err := client.Post(url, "application/octet-stream", bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e structs.Error
		json.NewDecoder(resp.Body).Decode(&e)
		return nil, nil, &e
	}
	var out map[string][]byte
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, nil, err
	}
	return out["cert"], out["ca"], nil
}

// TestJoin_Flow joins a host as the roles will: it pins the CA from the
// token, enrols over the join listener, then dials the mutual TLS listener
// with its certificate and renews there.
func TestJoin_Flow(t *testing.T) {
	f := newFixture(t, nil)
	joinURL := serve(t, f, f.auth.JoinServerTLS())
	hostURL := serve(t, f, f.auth.ServerTLS())

	tokStr, err := f.auth.NewJoinTokenFor("gpu-a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := ParseJoinToken(tokStr)
	if err != nil {
		t.Fatal(err)
	}
	key, csr := newCSR(t, "gpu-a")
	body, _ := json.Marshal(EnrollRequest{Token: tokStr, CSR: csr})
	joinCfg := HostJoinTLS(tok.Fingerprint)
	joinCfg.Time = f.clk.Now
	certDER, caDER, err := post(t, joinCfg, joinURL+"/join", body)
	if err != nil {
		t.Fatalf("join: %v", err)
	}
	ca, err := PinCA(caDER, tok.Fingerprint)
	if err != nil {
		t.Fatalf("pin: %v", err)
	}
	first := parseCert(t, certDER)
	creds := NewCredentials(key, &Issued{Certificate: first})
	hostCfg := HostTLS(ca, creds)
	hostCfg.Time = f.clk.Now

	// Renewal at two thirds of the lifetime, over mutual TLS.
	f.clk.Add(RenewAt(first).Sub(f.clk.Now()))
	key2, csr2 := newCSR(t, "gpu-a")
	certDER, _, err = post(t, hostCfg, hostURL+"/renew", csr2)
	if err != nil {
		t.Fatalf("renew: %v", err)
	}
	second := parseCert(t, certDER)
	if !second.NotAfter.After(first.NotAfter) || second.Subject.CommonName != "gpu-a" {
		t.Fatalf("renewed: %s until %s, first until %s", second.Subject.CommonName, second.NotAfter, first.NotAfter)
	}
	creds.Set(key2, &Issued{Certificate: second})

	// Past the first certificate's expiry the new one still connects.
	f.clk.Add(first.NotAfter.Sub(f.clk.Now()) + time.Second)
	_, csr3 := newCSR(t, "gpu-a")
	if _, _, err := post(t, hostCfg, hostURL+"/renew", csr3); err != nil {
		t.Fatalf("renew with the renewed certificate: %v", err)
	}

	// A renewal for another name is refused.
	_, csrB := newCSR(t, "gpu-b")
	if _, _, err := post(t, hostCfg, hostURL+"/renew", csrB); !structs.HasCode(err, structs.CodeHostNameChanged) {
		t.Fatalf("renew under another name: %v, want host_name_changed", err)
	}

	// The join listener refuses the spent token.
	if _, _, err := post(t, joinCfg, joinURL+"/join", body); !structs.HasCode(err, structs.CodeJoinTokenUsed) {
		t.Fatalf("join again: %v, want join_token_used", err)
	}

	// Revoked: the renewal's new handshake fails.
	if err := f.auth.Revoke("gpu-a"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := post(t, hostCfg, hostURL+"/renew", csr3); err == nil {
		t.Fatal("a revoked host renewed")
	}
}

func parseCert(t *testing.T, der []byte) *x509.Certificate {
	t.Helper()
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestHostJoinTLS_Pinning: a host pins the CA the token names before it
// sends anything.
func TestHostJoinTLS_Pinning(t *testing.T) {
	f := newFixture(t, nil)
	other := newFixture(t, nil)
	cases := []struct {
		name     string
		token    func() [32]byte
		dialName string
		wantCode structs.Code
		wantMsg  string
	}{
		{name: "the token's CA", token: f.ca.Fingerprint, dialName: "127.0.0.1"},
		{name: "the token's CA, by name", token: f.ca.Fingerprint, dialName: "localhost"},
		{name: "another CA's fingerprint", token: other.ca.Fingerprint, dialName: "127.0.0.1", wantCode: structs.CodeJoinCAMismatch, wantMsg: "not the one the join token names"},
		{name: "a name the server certificate lacks", token: f.ca.Fingerprint, dialName: "gpu.example", wantCode: structs.CodeJoinCAMismatch, wantMsg: "gpu.example"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			client := HostJoinTLS(c.token())
			client.Time = f.clk.Now
			client.ServerName = c.dialName
			serverErr, clientErr := handshake(t, f.auth.JoinServerTLS(), client)
			if c.wantCode == "" {
				if serverErr != nil || clientErr != nil {
					t.Fatalf("server: %v, client: %v", serverErr, clientErr)
				}
				return
			}
			if !structs.HasCode(clientErr, c.wantCode) || !strings.Contains(clientErr.Error(), c.wantMsg) {
				t.Fatalf("client: %v, want %s with %q", clientErr, c.wantCode, c.wantMsg)
			}
			if serverErr == nil {
				t.Fatal("the server finished a handshake the host refused")
			}
		})
	}
}

// TestRevoke_OpenConnection: a revocation refuses new handshakes; a
// connection opened before it stays open (the caller that owns it closes
// it).
func TestRevoke_OpenConnection(t *testing.T) {
	f := newFixture(t, nil)
	creds, _ := f.enroll(t, "gpu-a")
	ln, err := tls.Listen("tcp", "127.0.0.1:0", f.auth.ServerTLS())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	handshakes := make(chan error, 2)
	go func() {
		for {
			raw, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				c := raw.(*tls.Conn)
				defer c.Close()
				err := c.Handshake()
				handshakes <- err
				if err != nil {
					return
				}
				io.Copy(c, c) // echo
			}()
		}
	}()
	open, err := tls.Dial("tcp", ln.Addr().String(), f.hostTLS(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	r := bufio.NewReader(open)
	echo := func(line string) error {
		if _, err := open.Write([]byte(line)); err != nil {
			return err
		}
		got, err := r.ReadString('\n')
		if err == nil && got != line {
			err = errors.New("echoed " + got)
		}
		return err
	}
	if err := echo("before\n"); err != nil {
		t.Fatal(err)
	}
	if err := <-handshakes; err != nil {
		t.Fatal(err)
	}

	if err := f.auth.Revoke("gpu-a"); err != nil {
		t.Fatal(err)
	}
	if err := echo("after\n"); err != nil {
		t.Fatalf("the connection opened before the revocation: %v", err)
	}
	second, err := tls.Dial("tcp", ln.Addr().String(), f.hostTLS(creds))
	if err == nil {
		// The server refuses after the client's side of the handshake
		// (TLS 1.3): a round trip shows it. A passing handshake echoes.
		if _, err = second.Write([]byte("new\n")); err == nil {
			_, err = bufio.NewReader(second).ReadString('\n')
		}
		second.Close()
	}
	if err == nil {
		t.Fatal("a new connection of a revoked host passed")
	}
	if err := <-handshakes; !structs.HasCode(err, structs.CodeHostRevoked) {
		t.Fatalf("server: %v, want host_revoked", err)
	}
}

func TestAuthority_Renew(t *testing.T) {
	f := newFixture(t, nil)
	_, iss := f.enroll(t, "gpu-a")
	state := func(c *Issued) tls.ConnectionState {
		return tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{c.Certificate, f.ca.Certificate()}}}
	}
	_, csr := newCSR(t, "gpu-a")
	_, csrB := newCSR(t, "gpu-b")
	cases := []struct {
		name     string
		prepare  func()
		state    tls.ConnectionState
		csr      []byte
		wantCode structs.Code
	}{
		{name: "an unexpired certificate", state: state(iss), csr: csr},
		{name: "another name", state: state(iss), csr: csrB, wantCode: structs.CodeHostNameChanged},
		{name: "no verified certificate", state: tls.ConnectionState{}, csr: csr, wantCode: structs.CodeUnauthorized},
		{name: "a certificate that expired during the connection", state: state(iss), csr: csr, wantCode: structs.CodeUnauthorized,
			prepare: func() { f.clk.Add(DefaultHostCertLifetime + time.Second) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.prepare != nil {
				c.prepare()
			}
			got, err := f.auth.Renew(c.state, c.csr)
			if c.wantCode != "" {
				if !structs.HasCode(err, c.wantCode) {
					t.Fatalf("got %v, want %s", err, c.wantCode)
				}
				return
			}
			if err != nil {
				t.Fatalf("renew: %v", err)
			}
			if got.Certificate.Subject.CommonName != "gpu-a" || got.Certificate.NotAfter.Before(iss.Certificate.NotAfter) {
				t.Fatalf("renewed %q until %s, had until %s", got.Certificate.Subject.CommonName, got.Certificate.NotAfter, iss.Certificate.NotAfter)
			}
		})
	}
}

func TestRenewAt(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		name string
		life time.Duration
		want time.Duration
	}{
		{name: "the default day", life: 24 * time.Hour, want: 16 * time.Hour},
		{name: "an hour", life: time.Hour, want: 40 * time.Minute},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := RenewAt(&x509.Certificate{NotBefore: start, NotAfter: start.Add(c.life)})
			if got.Sub(start) != c.want {
				t.Fatalf("RenewAt = start+%s, want start+%s", got.Sub(start), c.want)
			}
		})
	}
}
