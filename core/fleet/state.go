// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/structs"
)

// The replicated records the server reads, from the state machine
// (core/fleet/fsm).
type (
	HostRecord     = fsm.HostRecord
	Placement      = fsm.Placement
	HostShare      = fsm.HostShare
	GroupPlacement = fsm.GroupPlacement
	RankDesired    = fsm.RankDesired
)

// applyTimeout bounds a follower's call that has the leader commit a
// command, and its wait to apply it.
const applyTimeout = 30 * time.Second

// apply commits one command of the replicated state, on any server, and
// returns once this server applied it. The leader commits it; a follower
// sends it to the leader (POST /apply between servers) and waits until its
// own state applied the entry, so that a read on it afterwards sees the
// change.
func (s *Server) apply(c fsm.Command) error {
	_, err := s.applyIndexed(c, nil)
	return err
}

// applyValue is apply for a command whose apply answers a value: decoded
// into out (its JSON form, the same on the leader and on a follower).
func (s *Server) applyValue(c fsm.Command, out any) error {
	_, err := s.applyIndexed(c, out)
	return err
}

// applyIndexed is applyValue, returning the index of the command's entry
// (a wait for the hosts' answer to the change waits for that one).
func (s *Server) applyIndexed(c fsm.Command, out any) (uint64, error) {
	if s.leaderOnly() == nil {
		v, idx, err := s.State.Apply(c)
		if err != nil && !structs.HasCode(err, structs.CodeNotLeader) {
			return idx, err
		}
		if err == nil {
			return idx, decodeValue(v, out)
		}
		// Leadership moved between the check and the commit: the new
		// leader takes it.
	}
	data, err := fsm.Encode(c, time.Now())
	if err != nil {
		return 0, err
	}
	return s.applyOnLeader(data, out)
}

// decodeValue hands an apply's value to out through its JSON form.
func decodeValue(v any, out any) error {
	if out == nil || v == nil {
		return nil
	}
	data, err := json.Marshal(v)
	if err != nil {
		return structs.Wrap(structs.CodeInternal, err, "encode a command's value")
	}
	return json.Unmarshal(data, out)
}

// applyAnswer is the leader's answer to POST /apply.
type applyAnswer struct {
	Index uint64          `json:"index"`
	Value json.RawMessage `json:"value,omitempty"`
}

// applyOnLeader has the leader commit an encoded command and waits until
// this server applied its entry (both bounded by applyTimeout).
func (s *Server) applyOnLeader(data []byte, out any) (uint64, error) {
	ctx, cancel := context.WithTimeout(s.runCtx(), applyTimeout)
	defer cancel()
	st := s.cl.node.View()
	if st.LeaderAddress == "" {
		return 0, s.notLeader(st)
	}
	var ans applyAnswer
	if err := postJSON(ctx, s.cl.client, st.LeaderAddress, "/apply", data, &ans); err != nil {
		if structs.HasCode(err, structs.CodeUnavailable) {
			return 0, s.notLeader(st).WithDetail("relay_error", err.Error())
		}
		return 0, err
	}
	if err := s.State.WaitApplied(ctx, ans.Index); err != nil {
		return ans.Index, structs.Errf(structs.CodeUnavailable, "the leader committed the change at index %d; this server has not applied it yet", ans.Index).
			WithDetail("index", ans.Index)
	}
	if out != nil && len(ans.Value) > 0 {
		return ans.Index, json.Unmarshal(ans.Value, out)
	}
	return ans.Index, nil
}

// runCtx is the server's context once it started (Background before).
func (s *Server) runCtx() context.Context {
	if s.ctx == nil {
		return context.Background()
	}
	return s.ctx
}

// serveApply commits a command a follower sent (POST /apply between
// servers). IMPORTANT: the leader commits only what it can read itself,
// or a command its writer flagged ignorable: a newer follower's command
// of a type this leader does not know would halt this leader and the
// servers of its release.
func (s *Server) serveApply(w http.ResponseWriter, r *http.Request) {
	data, err := io.ReadAll(io.LimitReader(r.Body, maxMgmtBody+1))
	if err != nil || len(data) > maxMgmtBody {
		writeLinkError(w, structs.Errf(structs.CodeInvalidRequest, "a command is read whole and is at most %d bytes", maxMgmtBody))
		return
	}
	env, _, err := fsm.Decode(data)
	var unknown *fsm.UnknownCommandError
	switch {
	case errors.As(err, &unknown) && !env.Ignorable:
		writeLinkError(w, structs.Errf(structs.CodeUnsupported,
			"the leader %s cannot read command %q (version %d) and it is not flagged ignorable: upgrade the leader before using it", s.cl.name, env.Op, env.V))
		return
	case err != nil && !errors.As(err, &unknown):
		writeLinkError(w, structs.Errf(structs.CodeInvalidRequest, "%v", err))
		return
	}
	res, idx, err := s.cl.node.Propose(data)
	if err == nil {
		err = res.Err
	}
	if err != nil {
		writeLinkError(w, err)
		return
	}
	ans := applyAnswer{Index: idx}
	if res.Value != nil {
		if ans.Value, err = json.Marshal(res.Value); err != nil {
			writeLinkError(w, structs.Wrap(structs.CodeInternal, err, "encode the command's value"))
			return
		}
	}
	writeJSONAnswer(w, ans)
}
