// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/capyctl/capyctl/core/fleet/raftlog"
	"github.com/capyctl/capyctl/core/structs"
)

// relayDrop are not relayed (net/http's own list, plus the operator's
// credential: the leader's handler gets its own admin token).
var relayDrop = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Authorization", "Cookie"}

// ForwardMutation wraps a mutating management route (api.Backend.Forward):
// on the leader, or a server alone, it serves the request itself; on a
// follower it relays the request to the leader over the server-to-server
// mutual TLS (ALPN capyctl-server/1) and returns the leader's answer as it
// is, once the leader committed the change. With no leader (an election)
// the answer is not_leader (503, retryable). A request that reached this
// server relayed already is never relayed again.
func (s *Server) ForwardMutation(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		st := s.cl.node.View()
		if st.State == "leader" {
			next(w, r)
			return
		}
		if r.Header.Get(headerForwarded) != "" || st.LeaderAddress == "" {
			writeError(w, s.notLeader(st))
			return
		}
		s.relayToLeader(w, r, st)
	}
}

// relayToLeader sends one management request to the leader and copies its
// answer.
func (s *Server) relayToLeader(w http.ResponseWriter, r *http.Request, st raftlog.Stats) {
	body, err := readMgmtBody(r)
	if err != nil {
		writeError(w, err)
		return
	}
	ctx, stop := s.relayContext(r.Context(), st)
	defer stop()
	req, err := http.NewRequestWithContext(ctx, r.Method, "http://"+st.LeaderAddress+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		writeError(w, structs.Wrap(structs.CodeInternal, err, "relay to the leader"))
		return
	}
	for k, vs := range r.Header {
		req.Header[k] = append([]string(nil), vs...)
	}
	for _, h := range relayDrop {
		req.Header.Del(h)
	}
	req.Header.Set(headerForwarded, s.cl.name)
	if d, ok := ctx.Deadline(); ok {
		req.Header.Set(headerRelayDeadline, strconv.FormatInt(d.UnixMilli(), 10))
	}
	start := time.Now()
	resp, err := s.cl.client.Do(req)
	if err != nil {
		writeError(w, s.relayRefusal(ctx, st, err))
		return
	}
	defer resp.Body.Close()
	if idx, err := strconv.ParseUint(resp.Header.Get(headerIndex), 10, 64); err == nil {
		s.awaitApplied(r.Context(), idx)
	}
	for k, vs := range resp.Header {
		if k != headerIndex {
			w.Header()[k] = vs
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
	s.logger.Debug("relayed a mutation to the leader", "method", r.Method, "path", r.URL.Path, "leader", st.LeaderID,
		"status", resp.StatusCode, "took", time.Since(start))
}

// awaitApplied waits (bounded by appliedWait) until this server's state
// applied the log up to idx (the leader's last applied command when it
// answered), on the state's change signal: a follower answers a relayed
// mutation once its own state shows it, so the client's next read on it
// does too.
func (s *Server) awaitApplied(ctx context.Context, idx uint64) {
	ctx, cancel := context.WithTimeout(ctx, appliedWait)
	defer cancel()
	if err := s.State.WaitApplied(ctx, idx); err != nil {
		s.logger.Debug("a relayed mutation's change is not applied here yet", "index", idx, "applied", s.State.Applied())
	}
}
