// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/pki"
	"github.com/capyctl/capyctl/core/structs"
)

// serverJoinRequest is a joining server's POST /server-join.
type serverJoinRequest struct {
	Token string `json:"token"`
	Name  string `json:"name"`
}

// serverJoinAnswer carries the cluster's CA, certificate and key (PEM),
// and the secrets every server shares.
type serverJoinAnswer struct {
	CACert  []byte         `json:"ca_cert"`
	CAKey   []byte         `json:"ca_key"`
	Secrets ClusterSecrets `json:"secrets"`
}

// serverAddRequest is POST /server-add: the leader adds the server as a
// voter.
type serverAddRequest struct {
	Name    string `json:"name"`
	Address string `json:"address"`
}

// fetchClusterCA is a joining server's first step, before its CA is
// loaded: it redeems the server join token at the leader and installs the
// cluster's CA in dir.
func fetchClusterCA(o ServerOptions, dir string, logger hclog.Logger) error {
	if o.JoinToken == "" {
		return structs.Errf(structs.CodeInvalidConfig, "a server joining a cluster needs a server join token (capyctl create join-token --role server on a running server; --join-token-file or CAPYCTL_JOIN_TOKEN)")
	}
	tok, err := pki.ParseJoinToken(o.JoinToken)
	if err != nil {
		return err
	}
	cfg := pki.HostJoinTLS(tok.Fingerprint)
	cfg.NextProtos = []string{ALPNServerJoin}
	body := mustJSON(serverJoinRequest{Token: o.JoinToken, Name: o.Name})
	var ans serverJoinAnswer
	err = untilLeader(context.Background(), joinAddrs(o.Join), logger, func(ctx context.Context, addr string) error {
		return postJSON(ctx, dialClient(cfg), addr, "/server-join", body, &ans)
	})
	if err != nil {
		return err
	}
	if ans.Secrets.APIKey == "" || ans.Secrets.AdminToken == "" {
		return structs.Errf(structs.CodeInternal, "the cluster did not hand over its API key and admin token (a server of an older release?)")
	}
	if o.AdoptSecrets != nil {
		if err := o.AdoptSecrets(ans.Secrets); err != nil {
			return err
		}
	}
	if _, err := pki.InstallCA(dir, ans.CACert, ans.CAKey); err != nil {
		return err
	}
	logger.Info("joined the server cluster: received its CA, API key and admin token", "server", o.Join)
	return nil
}

// joinAddrs splits server_join: one or more cluster addresses,
// comma-separated.
func joinAddrs(join string) []string {
	var out []string
	for _, a := range strings.Split(join, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// untilLeader calls f on the first address; a not_leader answer naming a
// leader sends the next try there, one naming none waits for the
// election, and an address out of reach (unavailable) gives way to the
// next one given. Gives up after clusterJoinTimeout.
func untilLeader(ctx context.Context, addrs []string, logger hclog.Logger, f func(ctx context.Context, addr string) error) error {
	ctx, cancel := context.WithTimeout(ctx, clusterJoinTimeout)
	defer cancel()
	if len(addrs) == 0 {
		return structs.Errf(structs.CodeInvalidConfig, "no server to join (server_join)")
	}
	next, addr := 0, addrs[0]
	for {
		err := f(ctx, addr)
		if err == nil {
			return nil
		}
		e := structs.AsError(err)
		retry := e.Code == structs.CodeNotLeader || e.Code == structs.CodeUnavailable
		if !retry {
			return err
		}
		if l, _ := e.Details["leader_address"].(string); l != "" {
			addr = l
		} else if e.Code == structs.CodeUnavailable && len(addrs) > 1 {
			next = (next + 1) % len(addrs)
			addr = addrs[next]
		}
		logger.Debug("server cluster: trying again", "address", addr, "error", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("join the server cluster: %w", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// serveServerJoin answers a joining server: its server join token buys
// the cluster's CA.
func (s *Server) serveServerJoin(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/server-join" {
		writeLinkError(w, structs.Errf(structs.CodeNotFound, "no route %s %s", r.Method, r.URL.Path))
		return
	}
	var req serverJoinRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 16<<10)).Decode(&req); err != nil {
		writeLinkError(w, structs.Errf(structs.CodeInvalidRequest, "the server join request is not valid JSON: %v", err))
		return
	}
	for _, m := range s.cl.node.Stats().Servers {
		if m.ID == req.Name {
			writeLinkError(w, structs.Errf(structs.CodeConflict, "a server named %q is a member of the cluster already; remove it first (capyctl remove server %s) or give the new one another --hostname", req.Name, req.Name))
			return
		}
	}
	if s.o.Secrets == nil {
		writeLinkError(w, structs.Errf(structs.CodeUnavailable, "server %s has no credentials to hand over yet", s.cl.name))
		return
	}
	if err := s.auth.RedeemServerToken(req.Token); err != nil {
		s.logger.Warn("server join refused", "remote", r.RemoteAddr, "name", req.Name, "code", string(structs.AsError(err).Code))
		writeLinkError(w, err)
		return
	}
	// A name removed before is taken back: the machine joins anew.
	if _, revoked := s.State.ServerRevoked(req.Name); revoked {
		if err := s.apply(fsm.ServerAdmitted{Name: req.Name}); err != nil {
			writeLinkError(w, err)
			return
		}
	}
	certPEM, keyPEM, err := s.cl.ca.EncodePEM()
	if err != nil {
		writeLinkError(w, err)
		return
	}
	s.logger.Info("a server redeemed a server join token", "name", req.Name, "remote", r.RemoteAddr)
	writeJSONAnswer(w, serverJoinAnswer{CACert: certPEM, CAKey: keyPEM, Secrets: s.o.Secrets()})
}

// servePeer answers another server (server peer certificate verified).
func (s *Server) servePeer(w http.ResponseWriter, r *http.Request) {
	cl := s.cl
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/status":
		writeJSONAnswer(w, cl.node.Stats())
	case r.Method == http.MethodPost && r.URL.Path == "/apply":
		s.serveApply(w, r)
	case r.Method == http.MethodPost && r.URL.Path == "/remove-server":
		var req serverAddRequest
		if err := json.NewDecoder(io.LimitReader(r.Body, 16<<10)).Decode(&req); err != nil || req.Name == "" {
			writeLinkError(w, structs.Errf(structs.CodeInvalidRequest, "a server removal names the server"))
			return
		}
		if err := s.RemoveServer(req.Name); err != nil {
			writeLinkError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodPost && r.URL.Path == "/removed":
		// The leader says this server was removed: the configuration entry
		// may never reach it (the leader stops replicating to it).
		s.fail(structs.Errf(structs.CodeServerRemoved,
			"server %s was removed from the cluster (capyctl remove server): it stops; move its state directory away and join it again with a new server join token", cl.name))
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodPost && r.URL.Path == "/server-add":
		var req serverAddRequest
		if err := json.NewDecoder(io.LimitReader(r.Body, 16<<10)).Decode(&req); err != nil || req.Name == "" || req.Address == "" {
			writeLinkError(w, structs.Errf(structs.CodeInvalidRequest, "a server addition names the server and its address"))
			return
		}
		if err := cl.node.AddVoter(req.Name, req.Address); err != nil {
			writeLinkError(w, err)
			return
		}
		s.logger.Info("server added to the cluster", "name", req.Name, "address", req.Address)
		s.growExpect()
		w.WriteHeader(http.StatusNoContent)
	case strings.HasPrefix(r.URL.Path, "/responses/"):
		s.servePeerResponses(w, r) // another server asks for a response this one holds (responses.go)
	case r.Method == http.MethodPost && r.URL.Path == "/key-counts":
		s.serveKeyCounts(w, r) // another server's use of the keys with limits (apikeys.go)
	default:
		cl.mu.Lock()
		h, token := cl.mgmt, cl.adminToken
		cl.mu.Unlock()
		if h == nil {
			writeLinkError(w, structs.Errf(structs.CodeUnavailable, "server %s is starting", cl.name))
			return
		}
		r.Header.Set("Authorization", "Bearer "+token)
		if r.Header.Get(headerForwarded) == "" {
			r.Header.Set(headerForwarded, "server")
		}
		h.ServeHTTP(&indexWriter{ResponseWriter: w, applied: s.State.Applied}, withRelayDeadline(r))
	}
}

// indexWriter names, in the answer's head, the index of the last command
// the leader's state applied once the relayed mutation was served: the
// follower that relayed it answers its client once its own state applied
// that far, so that a read on it after the answer sees the change (read
// your writes).
type indexWriter struct {
	http.ResponseWriter
	applied     func() uint64
	wroteHeader bool
}

func (w *indexWriter) WriteHeader(code int) {
	if !w.wroteHeader {
		w.wroteHeader = true
		w.Header().Set(headerIndex, fmt.Sprint(w.applied()))
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *indexWriter) Write(b []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

func (w *indexWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// mustJSON marshals v, whose types always marshal.
func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}
