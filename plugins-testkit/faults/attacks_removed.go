// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package faults

import (
	"bytes"
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"time"

	"github.com/capyctl/capyctl/plugins-testkit/attack"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// RemovedHostStolenCertificate (H2) steals a joined host's key and
// certificate, removes the host, joins it again under its name with a new
// token, and then plays the thief: the stolen identity's host link and a
// renewal with it must be refused at the handshake, and the host's new
// link kept. (The revocation is the cluster's replicated state, so every
// server refuses alike: TestCluster_ARemovedHostsOldCertificateStaysRefused
// checks the followers.)
func RemovedHostStolenCertificate() Attack {
	return Attack{Name: "a removed host's stolen certificate, once the host joined again", Finding: "H2", Inject: func(e *AttackEnv) {
		s := e.Scale
		victim := harness.StartHost(e.T, e.Server, harness.HostOptions{Name: "gpu-b"})
		if !hostReady(e.Server, "gpu-b", s.Recover) {
			e.T.Fatalf("gpu-b not ready")
		}
		id, err := attack.StealHostIdentity(victim.StateDir)
		if err != nil {
			e.T.Fatalf("steal gpu-b's identity: %v", err)
		}
		if out, code, _ := e.CLI(30*time.Second, "remove", "host", "gpu-b"); code != 0 {
			e.Problem("remove host gpu-b: exit %d: %s", code, firstLine(out))
			return
		}
		removed := time.Now()
		if code := victim.WaitExit(s.Recover); code != 3 {
			e.Problem("the removed host's agent exited %d, want 3 (host_revoked)", code)
		}
		// A certificate signed in the revocation's second is revoked with
		// the old ones: the host joins again from the next second on.
		waitUntil(2*time.Second, func() bool { return time.Now().Truncate(time.Second).After(removed) })
		harness.StartHost(e.T, e.Server, harness.HostOptions{Name: "gpu-b"})
		if !hostReady(e.Server, "gpu-b", s.Recover) {
			e.Problem("gpu-b did not join again with a new token within %s", s.Recover)
			return
		}
		e.Note("gpu-b removed and joined again with a new token")

		thief := &attack.CompromisedHost{ID: id, Server: e.Server.ClusterAddr}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		link, err := thief.Link(ctx, nil)
		cancel()
		if err == nil {
			link.Close()
			e.Problem("the server took a host link from the removed host's stolen certificate")
		} else {
			e.Note("the stolen certificate's host link: refused (%s)", attack.ShortErr(err))
		}
		if status, err := renewWith(id, e.Server.ClusterAddr); err == nil {
			e.Problem("the server answered a renewal with the stolen certificate (%d), want a refused handshake", status)
		} else {
			e.Note("its renewal: refused at the handshake (%s)", attack.ShortErr(err))
		}
		if !hostReady(e.Server, "gpu-b", s.Recover) {
			e.Problem("the host's new link was lost")
		}
	}}
}

// renewWith posts a renewal to the server at addr with the identity: the
// status of an answer, or the error of a connection the server refused.
func renewWith(id *attack.HostIdentity, addr string) (int, error) {
	cfg := id.TLS(addr, "http/1.1")
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialTLSContext: func(ctx context.Context, network, a string) (net.Conn, error) {
			d := &tls.Dialer{Config: cfg}
			return d.DialContext(ctx, network, a)
		},
	}}
	defer client.CloseIdleConnections()
	resp, err := client.Post("https://"+addr+"/renew", "application/octet-stream", bytes.NewReader([]byte("not a CSR")))
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}
