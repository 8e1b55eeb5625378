// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package hostagent

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/structs"
)

// A host takes its share of the desired state from the leader, reconciles
// what it runs with it (Local.ApplyDesired) and answers DesiredApplied.
//
// The fence: the host remembers the newest raft term any server told it
// (every Welcome carries the server's term, every Desired its leader's)
// across its restarts (<state_dir>/host-pki/term). A Desired of an older
// term is a deposed leader's, which may arrive late (a partition that
// held it, a leader paused and resumed): it is refused (stale_term) and
// changes nothing. Within a term, an older share than the one applied is
// ignored.

// termFile remembers the newest term the host has seen.
func (h *Host) termFile() string { return filepath.Join(hostPKIDir(h.o.StateDir), "term") }

// loadTerm reads the term the host saw at its last run.
func (h *Host) loadTerm() {
	data, err := os.ReadFile(h.termFile())
	if err != nil {
		return
	}
	if t, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64); err == nil {
		h.term = t
	}
}

// seeTerm takes a server's term: the newest one seen is kept (and
// written, so that a restart keeps the fence).
func (h *Host) seeTerm(term uint64) {
	h.termMu.Lock()
	defer h.termMu.Unlock()
	if term <= h.term {
		return
	}
	h.term = term
	tmp := h.termFile() + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.FormatUint(term, 10)+"\n"), 0o600); err == nil {
		if err := os.Rename(tmp, h.termFile()); err != nil {
			h.logger.Debug("remember the newest term", "error", err)
		}
	}
}

// Term is the newest raft term this host has seen.
func (h *Host) Term() uint64 {
	h.termMu.Lock()
	defer h.termMu.Unlock()
	return h.term
}

// offerDesired takes a share one server's link delivered: refused when
// its term is older than the newest seen (answered on that link),
// ignored when older than the one pending or applied in its term, else
// handed to the reconciler (the newest share wins: the reconciler
// applies the latest, whole).
func (h *Host) offerDesired(l *serverLink, d *hostv1.Desired) {
	h.termMu.Lock()
	if d.GetTerm() < h.term {
		newest := h.term
		h.termMu.Unlock()
		h.logger.Warn("refused a desired state from a deposed leader: a newer term was seen", "server", l.addr, "term", d.GetTerm(), "newest_term", newest)
		l.queue(&hostv1.HostMessage{Body: &hostv1.HostMessage_Applied{Applied: &hostv1.DesiredApplied{Term: d.GetTerm(), Index: d.GetIndex(),
			Code: string(structs.CodeStaleTerm), Message: "a newer leader's term reached this host first: term " + strconv.FormatUint(newest, 10)}}})
		return
	}
	h.termMu.Unlock()
	h.seeTerm(d.GetTerm())
	h.termMu.Lock()
	defer h.termMu.Unlock()
	if last := h.desired; last != nil && last.d.GetTerm() == d.GetTerm() && last.d.GetIndex() > d.GetIndex() {
		return
	}
	h.desired = &offered{d: d, l: l}
	select {
	case h.desiredDue <- struct{}{}:
	default:
	}
}

// offered is a share and the link it came on.
type offered struct {
	d *hostv1.Desired
	l *serverLink
}

// reconcileDesired applies the newest share offered, one at a time, until
// ctx ends: the host's own lifecycle and ledger do the work
// (Local.ApplyDesired); the answer goes back on the link the share came
// on.
func (h *Host) reconcileDesired(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.desiredDue:
		}
		h.termMu.Lock()
		o := h.desired
		stale := o != nil && o.d.GetTerm() < h.term
		h.termMu.Unlock()
		if o == nil || stale {
			continue
		}
		started := time.Now()
		h.logger.Debug("applying the desired state", "server", o.l.addr, "term", o.d.GetTerm(), "index", o.d.GetIndex(),
			"engines", len(o.d.GetEngines()), "deployments", len(o.d.GetDeployments()))
		results := h.o.Local.ApplyDesired(ctx, o.d)
		h.logger.Info("desired state applied", "term", o.d.GetTerm(), "index", o.d.GetIndex(), "results", len(results), "took", time.Since(started))
		o.l.queue(&hostv1.HostMessage{Body: &hostv1.HostMessage_Applied{Applied: &hostv1.DesiredApplied{
			Term: o.d.GetTerm(), Index: o.d.GetIndex(), Results: results, StartedUnixMs: started.UnixMilli()}}})
	}
}

// queue hands a message to the link's run loop, which sends it on the
// current stream; the oldest waiting message gives way when the queue is
// full (a newer answer supersedes it).
func (l *serverLink) queue(m *hostv1.HostMessage) {
	for {
		select {
		case l.out <- m:
			return
		default:
		}
		select {
		case <-l.out:
		default:
		}
	}
}

// offerCommand runs one of the leader's commands: refused when its term is
// older than the newest seen (stale_term), else once per command_id (the
// Deduper: a retry answers the first run's result) on a goroutine of its
// own under Run's context; the result goes back on the link it came on.
func (h *Host) offerCommand(l *serverLink, cmd *hostv1.Command) {
	h.termMu.Lock()
	newest := h.term
	h.termMu.Unlock()
	if cmd.GetTerm() < newest {
		h.logger.Warn("refused a command from a deposed leader: a newer term was seen", "server", l.addr, "term", cmd.GetTerm(), "newest_term", newest,
			"command", cmd.GetCommandId())
		l.queue(&hostv1.HostMessage{Body: &hostv1.HostMessage_Result{Result: &hostv1.CommandResult{CommandId: cmd.GetCommandId(),
			Code: string(structs.CodeStaleTerm), Message: "a newer leader's term reached this host first: term " + strconv.FormatUint(newest, 10)}}})
		return
	}
	h.seeTerm(cmd.GetTerm())
	h.mu.Lock()
	ctx := h.runCtx
	if ctx == nil || ctx.Err() != nil {
		h.mu.Unlock()
		return
	}
	h.goLocked(ctx, func(ctx context.Context) {
		res, err := h.dedup.Execute(ctx, cmd, h.o.Local.Commands())
		if err != nil {
			return // Run ends
		}
		l.queue(&hostv1.HostMessage{Body: &hostv1.HostMessage_Result{Result: res}})
	})
	h.mu.Unlock()
}
