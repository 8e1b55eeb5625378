// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"encoding/json"
	"io"
	"net/http"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/fleet/linkwire"
	"github.com/capyctl/capyctl/core/pki"
	"github.com/capyctl/capyctl/core/structs"
)

// JoinRequest and JoinAnswer are the join's and renewal's bodies
// (linkwire: the host agent reads them too).
type (
	JoinRequest = linkwire.JoinRequest
	JoinAnswer  = linkwire.JoinAnswer
)

func (s *Server) serveJoin(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/join" {
		writeLinkError(w, structs.Errf(structs.CodeNotFound, "no route %s %s", r.Method, r.URL.Path))
		return
	}
	var req JoinRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&req); err != nil {
		writeLinkError(w, structs.Errf(structs.CodeInvalidRequest, "the join request is not valid JSON: %v", err))
		return
	}
	// Any server takes a join: the token is redeemed, and the host
	// recorded, through the replicated log.
	iss, err := s.auth.Enroll(pki.EnrollRequest{Token: req.Token, CSR: req.CSR, Previous: req.Previous})
	if err != nil {
		s.logger.Debug("join refused", "remote", r.RemoteAddr, "code", string(structs.AsError(err).Code))
		s.refused.note("join_refused:"+string(structs.AsError(err).Code), ipOf(r.RemoteAddr))
		writeLinkError(w, err)
		return
	}
	name := iss.Certificate.Subject.CommonName
	if err := s.apply(fsm.HostJoined{Host: name}); err != nil {
		writeLinkError(w, err)
		return
	}
	s.event("host_joined", name, map[string]any{"remote": r.RemoteAddr, "certificate_expires": iss.Certificate.NotAfter})
	s.logger.Info("host joined", "host", name, "remote", r.RemoteAddr)
	writeJSONAnswer(w, JoinAnswer{Certificate: iss.Certificate.Raw, CA: iss.CA})
}

func (s *Server) serveRenew(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/renew" || r.TLS == nil {
		writeLinkError(w, structs.Errf(structs.CodeNotFound, "no route %s %s", r.Method, r.URL.Path))
		return
	}
	csr, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	if err != nil {
		writeLinkError(w, structs.Errf(structs.CodeInvalidRequest, "read the renewal: %v", err))
		return
	}
	// A host the (replicated) state does not have renews nowhere: removed
	// (host_revoked), or not known yet (host_unknown, after a restore).
	if pc := r.TLS.PeerCertificates; len(pc) > 0 {
		if _, member := s.State.Host(pc[0].Subject.CommonName); !member {
			writeLinkError(w, s.hostRefusal(pc[0].Subject.CommonName))
			return
		}
	}
	iss, err := s.auth.Renew(*r.TLS, csr)
	if err != nil {
		writeLinkError(w, err)
		return
	}
	s.mu.Lock()
	if h := s.hosts[iss.Certificate.Subject.CommonName]; h != nil {
		h.certExpiry = iss.Certificate.NotAfter
	}
	s.mu.Unlock()
	writeJSONAnswer(w, JoinAnswer{Certificate: iss.Certificate.Raw, CA: iss.CA})
}

func writeJSONAnswer(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// writeLinkError answers a join or renewal with the catalogue's envelope.
func writeLinkError(w http.ResponseWriter, err error) {
	e := structs.AsError(err)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(wire.HTTPStatus(e.Code))
	_ = json.NewEncoder(w).Encode(wire.ErrorEnvelope{APIVersion: wire.APIVersion,
		Error: wire.ErrorBody{Code: string(e.Code), Message: e.Message, Retryable: e.Info().Retryable, Details: e.Details}})
}

// NewJoinToken makes a one-time join token (api.Fleet).
func (s *Server) NewJoinToken(hostName string, ttl time.Duration) (wire.JoinToken, error) {
	tok, err := s.auth.NewJoinTokenFor(hostName, ttl)
	if err != nil {
		return wire.JoinToken{}, err
	}
	return wire.JoinToken{Token: tok, ExpiresAt: time.Now().UTC().Add(ttl), CAFingerprint: s.CAFingerprint(),
		HostName: hostName, ClusterAddress: s.advertise}, nil
}
