// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/fleet/hostagent"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/poll"
)

// TestCluster_ARemovedHostsOldCertificateStaysRefused pins the fleet-trust
// review's H2 on three servers: a host removed through the leader and
// joined again under its name with a new token; a copy of its old key and
// certificate (stolen before the removal) is refused by every server, the
// followers included, on the link and on a renewal, while the host's new
// certificate is taken by all of them and renews at a follower.
func TestCluster_ARemovedHostsOldCertificateStaysRefused(t *testing.T) {
	s1 := testServer(t, ServerOptions{Name: "s1", RaftTuning: steadyTuning, Secrets: testSecrets})
	s2 := joinSteady(t, s1, "s2")
	s3 := joinSteady(t, s1, "s3")
	servers := []*Server{s1, s2, s3}

	var tok wire.JoinToken
	onLeader(t, "a host join token", func() (err error) {
		tok, err = s1.NewJoinToken("", time.Minute)
		return err
	})
	dir := t.TempDir()
	var h *hostagent.Host
	onLeader(t, "join gpu-a through a follower", func() (err error) {
		h, err = hostagent.NewHost(context.Background(), hostagent.HostOptions{StateDir: dir, Server: s2.Addr(), JoinToken: tok.Token, Name: "gpu-a", Local: newFakeLocal()})
		return err
	})
	stop := runHost(t, h)
	for _, s := range servers {
		waitReady(t, s, "gpu-a")
	}
	// The thief's copy of the host's key and certificate.
	stolen := t.TempDir()
	copyPrivate(t, stolen, dir)

	onLeader(t, "remove host gpu-a", func() error { return s1.Remove("gpu-a") })
	stop()
	removed, ok := s3.State.HostRevoked("gpu-a")
	poll.Until(t, 10*time.Second, "every server knows the revocation", func() bool {
		removed, ok = s3.State.HostRevoked("gpu-a")
		_, ok2 := s2.State.HostRevoked("gpu-a")
		return ok && ok2
	})
	// A certificate signed in the revocation's second is revoked with the
	// old ones (pki.Authority.Revoke): the host joins again after it.
	poll.Until(t, 5*time.Second, "the second after the revocation", func() bool {
		return time.Now().Truncate(time.Second).After(removed)
	})

	// The host joins again, through a follower, with a new token.
	onLeader(t, "a host join token through a follower", func() (err error) {
		tok, err = s2.NewJoinToken("", time.Minute)
		return err
	})
	var again *hostagent.Host
	onLeader(t, "join gpu-a again", func() (err error) {
		again, err = hostagent.NewHost(context.Background(), hostagent.HostOptions{StateDir: t.TempDir(), Server: s3.Addr(), JoinToken: tok.Token, Name: "gpu-a", Local: newFakeLocal()})
		return err
	})
	runHost(t, again)
	for _, s := range servers {
		waitReady(t, s, "gpu-a")
	}

	// The stolen copy, at each server: refused on the link, and on a
	// renewal.
	for _, s := range servers {
		copyDir := t.TempDir()
		copyPrivate(t, copyDir, stolen)
		thief, err := hostagent.NewHost(context.Background(), hostagent.HostOptions{StateDir: copyDir, Server: s.Addr(), Name: "gpu-a", Local: newFakeLocal()})
		if err != nil {
			if !structs.HasCode(err, structs.CodeHostRevoked) {
				t.Fatalf("the stolen certificate at %s: %v, want host_revoked", s.cl.name, err)
			}
			continue
		}
		if err := thief.RenewNow(context.Background()); err == nil {
			t.Fatalf("server %s renewed the removed host's old certificate", s.cl.name)
		}
		// Its link is refused at the handshake, again and again; the host's
		// own link stays the one the server holds.
		gen := linkGen(s, "gpu-a")
		ctx, cancel := context.WithCancel(context.Background())
		ran := make(chan error, 1)
		go func() { ran <- thief.Run(ctx) }()
		poll.Until(t, 20*time.Second, "the stolen certificate refused at "+s.cl.name, func() bool {
			_, lastErr := thief.Linked()
			return lastErr != nil && strings.Contains(lastErr.Error(), "bad certificate")
		})
		cancel()
		<-ran
		if g := linkGen(s, "gpu-a"); g != gen {
			t.Fatalf("server %s took a link from the stolen certificate (link generation %d, then %d)", s.cl.name, gen, g)
		}
	}
	// The host's new certificate renews at a follower, and every server
	// takes the renewed one.
	if err := again.RenewNow(context.Background()); err != nil {
		t.Fatalf("the new certificate's renewal: %v", err)
	}
	for _, s := range servers {
		waitReady(t, s, "gpu-a")
	}
}

// copyPrivate copies the tree at src into dst, owner-only (the host's key
// files are refused otherwise).
func copyPrivate(t *testing.T, dst, src string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o700)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(to, data, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// linkGen is the generation of a host's link on s (0: none ever).
func linkGen(s *Server, host string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if lh := s.hosts[host]; lh != nil {
		return lh.linkGen
	}
	return 0
}
