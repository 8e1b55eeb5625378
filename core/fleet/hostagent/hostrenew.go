// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package hostagent

import (
	"context"
	"crypto/x509"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/fleet/linkwire"
	"github.com/capyctl/capyctl/core/pki"
	"github.com/capyctl/capyctl/core/structs"
)

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
	var ans *linkwire.JoinAnswer
	for _, addr := range addrs {
		if ans, err = h.post(ctx, h.tlsFor(addr, linkwire.ALPNHTTP1), addr, "/renew", "application/octet-stream", csr); err == nil {
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
