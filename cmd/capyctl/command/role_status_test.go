// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"testing"

	"github.com/capyctl/capyctl/core/api/wire"
)

func TestRequestLedgerLine(t *testing.T) {
	cases := []struct {
		name string
		in   wire.RequestLedgerStatus
		want string
	}{
		{"off", wire.RequestLedgerStatus{}, "ledger off"},
		{"nothing lost", wire.RequestLedgerStatus{Enabled: true}, "ledger on, 0 records dropped"},
		{"drops", wire.RequestLedgerStatus{Enabled: true, Dropped: 12},
			"ledger on, 12 records dropped (its queue was full or a commit failed; see capyctl_request_ledger_dropped_total)"},
		{"a failed commit", wire.RequestLedgerStatus{Enabled: true, Dropped: 3, LastError: "no space left on device"},
			"ledger on, 3 records dropped (its queue was full or a commit failed; see capyctl_request_ledger_dropped_total); last commit error: no space left on device"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := requestLedgerLine(&c.in); got != c.want {
				t.Fatalf("got %q, want %q", got, c.want)
			}
		})
	}
}
