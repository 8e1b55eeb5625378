// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package cluster_test

import (
	"bufio"
	"crypto/tls"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/pki"
)

// alpnServer is the cluster listener's server-to-server conversation
// (core/fleet's ALPNServer): server peer certificates only.
const alpnServer = "capyctl-server/1"

// peerAnswered dials addr's cluster listener as the server whose state
// directory is stateDir (its server peer certificate and key, ALPN
// capyctl-server/1) and sends one HTTP request: nil once an HTTP answer,
// whatever its status, came back; the error otherwise. A certificate the
// listener refuses ends the handshake with an alert, which TLS 1.3 shows
// the client at its first read. A certificate that cannot be read fails
// the test: it is not a refusal.
func peerAnswered(t *testing.T, addr, stateDir string) error {
	t.Helper()
	dir := filepath.Join(stateDir, "pki")
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, pki.ServerPeerCertFile), filepath.Join(dir, pki.ServerPeerKeyFile))
	if err != nil {
		t.Fatalf("the server peer certificate in %s: %v", dir, err)
	}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{
		MinVersion: tls.VersionTLS13,
		// The server's certificate is not what this checks: the
		// listener's verdict on ours is.
		InsecureSkipVerify: true,
		Certificates:       []tls.Certificate{cert},
		NextProtos:         []string{alpnServer},
	})
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return err
	}
	req, err := http.NewRequest(http.MethodGet, "https://"+addr+"/", nil)
	if err != nil {
		return err
	}
	if err := req.Write(conn); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}
