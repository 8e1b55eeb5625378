// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package apikeys

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// countRecorder counts what it is given, for the benchmarks.
type countRecorder struct{ n atomic.Int64 }

func (r *countRecorder) Record(string, structs.RequestUsage) { r.n.Add(1) }
func (r *countRecorder) MonthTokens(string, time.Time) int64 { return 0 }

// BenchmarkKeeper_Request is a request's whole cost in the keeper:
// authenticate, admit against the key's limits (with the rate-limit
// headers), settle its tokens and count its usage. "role key" (the key
// named default: no limits) is the same-run baseline for "named key with
// limits" (requests, tokens, concurrency and a monthly budget).
func BenchmarkKeeper_Request(b *testing.B) {
	k, err := New(Config{Backend: NewMemoryBackend(RoleKeyRecord(time.Now())), Usage: &countRecorder{},
		RoleKey: func() string { return roleKey }})
	if err != nil {
		b.Fatal(err)
	}
	limited, _, err := k.Create("bench", Spec{Limits: structs.KeyLimits{RPM: 1 << 40, TPM: 1 << 40, Concurrency: 1 << 20, MonthlyTokens: 1 << 50}})
	if err != nil {
		b.Fatal(err)
	}
	u := structs.RequestUsage{Model: "demo", UsageKnown: true, PromptTokens: 20, CompletionTokens: 100}
	for _, c := range []struct{ name, key string }{{"role key", roleKey}, {"named key with limits", limited}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					p, err := k.Authenticate(c.key)
					if err != nil {
						b.Fatal(err)
					}
					var hdr RateHeaders
					tk, err := p.Admit(&hdr)
					if err != nil {
						b.Fatal(err)
					}
					tk.Take()
					tk.Settle(u)
				}
			})
		})
	}
}
