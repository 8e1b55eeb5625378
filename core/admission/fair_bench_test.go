// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package admission

import (
	"fmt"
	"testing"
)

// BenchmarkDeployment_FairLine is the line's cost per request: a
// one-place deployment, 256 requests join its line, then the places are
// freed one at a time until every one was served. "one key" (every
// request the same key's: first come first served) is the same-run
// baseline for requests of 8 and of 256 keys, where each request's place
// in the line is searched by its tag.
func BenchmarkDeployment_FairLine(b *testing.B) {
	const n = 256
	for _, keys := range []int{1, 8, 256} {
		name := "one key"
		if keys > 1 {
			name = fmt.Sprintf("%d keys", keys)
		}
		fairs := make([]Fair, n)
		for i := range fairs {
			fairs[i] = Fair{Key: fmt.Sprint(i % keys)}
		}
		b.Run(name, func(b *testing.B) {
			d := New(Config{MaxWaitingTotal: 2 * n}).Deployment("d")
			d.SetLimits(1, 2*n)
			ready(d, 1)
			ws := make([]*Waiter, n)
			b.ReportAllocs()
			b.ResetTimer()
			for it := 0; it < b.N; it++ {
				first, _, _ := d.EnterFor(1, Fair{})
				for i := range ws {
					_, ws[i], _ = d.EnterFor(1, fairs[i])
				}
				cur := first
				for range ws {
					d.mu.Lock()
					next := d.queue[0] // the line's head is granted the freed place
					d.mu.Unlock()
					cur.Done()
					cur = next.Place()
				}
				cur.Done()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/request")
		})
	}
}
