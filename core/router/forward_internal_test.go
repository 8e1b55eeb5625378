// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/capyctl/capyctl/core/admission"
	"github.com/capyctl/capyctl/core/routes"
	"github.com/capyctl/capyctl/core/structs"
)

// TestAppendMember: the first member after the brace takes no comma.
func TestAppendMember(t *testing.T) {
	if got := string(appendMember([]byte("{"), "model")); got != `{"model":` {
		t.Fatalf("first member %q", got)
	}
	if got := string(appendMember([]byte(`{"a":1`), "model")); got != `{"a":1,"model":` {
		t.Fatalf("next member %q", got)
	}
}

// TestTakeSalt_LongestAccepted: a cache_salt of maxCacheSalt bytes is taken.
func TestTakeSalt_LongestAccepted(t *testing.T) {
	var q request
	s := strings.Repeat("s", maxCacheSalt)
	if !q.takeSalt(&s) {
		t.Fatal("a salt of the maximum length was refused")
	}
}

// abortLC answers every abort with sent and err.
type abortLC struct {
	sent bool
	err  error
}

func (a abortLC) Abort(ctx context.Context, _, _ string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err // a driver call past its deadline
	}
	return a.sent, a.err
}
func (abortLC) Load(context.Context, string) (routes.InstanceLoad, error) {
	return routes.InstanceLoad{}, nil
}
func (abortLC) InstanceRun(string) (uint64, structs.InstanceState, bool) {
	return 1, structs.StateReady, true
}
func (abortLC) RestartForSettlement(string) {}

// TestRouter_AbortSettles: the engine's answer that it stopped the request
// settles it at once; no answer (or an error) leaves it waiting for the
// fallback evidence.
func TestRouter_AbortSettles(t *testing.T) {
	cases := []struct {
		name      string
		lc        abortLC
		wantIdle  int
		wantAbort int
	}{
		{"stopped by the engine", abortLC{sent: true}, 0, 0},
		{"not found on the engine", abortLC{}, 1, 0},
		{"abort failed", abortLC{sent: true, err: errors.New("driver gone")}, 1, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := admission.New(admission.Config{}).Deployment("d")
			d.SetLimits(4, 8)
			d.Sync(1, []admission.Target{{Instance: "d/0", Generation: 1}})
			p, _, err := d.Enter(1)
			if err != nil || p == nil {
				t.Fatalf("enter: %v", err)
			}
			pe := p.Cut(admission.SettleOnAbort)
			rt := &Router{req: c.lc, ctx: context.Background(), logger: hclog.NewNullLogger()}
			rt.abort(pe, "d/0", "rid", admission.SettleWhenIdle)
			if got := d.Counts(); got.SettleWhenIdle != c.wantIdle || got.SettleOnAbort != c.wantAbort {
				t.Fatalf("counts %+v, want %d waiting for the idle reading", got, c.wantIdle)
			}
		})
	}
}
