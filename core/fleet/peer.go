// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"crypto/x509"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/capyctl/capyctl/core/structs"
)

// peerCert is the verified certificate of a link's host, nil without one.
func peerCert(ctx context.Context) *x509.Certificate {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return nil
	}
	return info.State.VerifiedChains[0][0]
}

// peerHostName is the host name a link's certificate carries.
func peerHostName(ctx context.Context) (string, error) {
	cert := peerCert(ctx)
	if cert == nil || cert.Subject.CommonName == "" {
		return "", structs.Errf(structs.CodeUnauthorized, "the host link needs a verified host certificate")
	}
	return cert.Subject.CommonName, nil
}

// peerAddr is a link's remote address.
func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}
