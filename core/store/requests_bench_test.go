// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// benchRecord is a record the size of a streamed request's (about 400 bytes
// of JSON).
func benchRecord(i int, at time.Time) structs.RequestRecord {
	return structs.RequestRecord{
		ID: "capy-" + strconv.FormatInt(int64(1_000_000_000+i), 16) + "0123456789abcdef", ClientRequestID: "client-req-" + strconv.Itoa(i),
		Deployment: "dep-" + strconv.Itoa(i%8), Instance: "inst-" + strconv.Itoa(i%8) + "-0", API: structs.APIChat, Stream: true,
		Outcome: "completed", Status: 200, ReceivedAt: at, QueueMs: 0.012, TTFBMs: 3.25, TotalMs: 81.5,
		BytesIn: 312, BytesOut: 9000, PromptTokens: 24, CompletionToks: 64, Key: "bench-key",
	}
}

// cpuNow returns the process's user+system CPU time.
func cpuNow() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func openBenchStore(b *testing.B) *Store {
	b.Helper()
	s, err := Open(PathIn(b.TempDir()), Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

var spinSink uint64

// spin does n rounds of arithmetic: a request's own work between two
// records, a fixed amount of CPU (a sleep's timer, or a spin until a
// time, would cost what a loaded machine decides).
func spin(n int) {
	x := spinSink
	for i := 0; i < n; i++ {
		x = x*6364136223846793005 + 1442695040888963407
	}
	spinSink = x
}

// BenchmarkRequestWriter_Record: Record from 1 and 32 goroutines, each
// busy between two records with spin(100 000) (a request's own work, tens
// of µs: the writer is idle between records at one goroutine, as at a c=1
// role), and back to back. cpu-ns/op is the process's CPU (the writer's
// and the spin's included) per record, until Close has written them all;
// compare it with BenchmarkSpin's.
func BenchmarkRequestWriter_Record(b *testing.B) {
	for _, c := range []struct {
		name       string
		goroutines int
		pace       int
	}{
		{name: "goroutines=1", goroutines: 1, pace: 100_000},
		{name: "goroutines=32", goroutines: 32, pace: 100_000},
		{name: "goroutines=32/unpaced", goroutines: 32},
	} {
		b.Run(c.name, func(b *testing.B) {
			s := openBenchStore(b)
			opts := DefaultRequestWriterOptions()
			opts.Buffer = b.N + c.goroutines // count Record, not drops
			w := NewRequestWriter(s, opts)
			recs := make([]structs.RequestRecord, 1024)
			now := time.Now()
			for i := range recs {
				recs[i] = benchRecord(i, now)
			}
			b.ReportAllocs()
			b.ResetTimer()
			cpu := cpuNow()
			var wg sync.WaitGroup
			per := (b.N + c.goroutines - 1) / c.goroutines
			for g := 0; g < c.goroutines; g++ {
				wg.Add(1)
				go func(g int) {
					defer wg.Done()
					for i := 0; i < per; i++ {
						w.Record(recs[(g*per+i)%len(recs)])
						if c.pace > 0 {
							spin(c.pace)
						}
					}
				}(g)
			}
			wg.Wait()
			_ = w.Close()
			b.StopTimer()
			b.ReportMetric(float64(cpuNow()-cpu)/float64(per*c.goroutines), "cpu-ns/op")
			if d := w.Dropped(); d != 0 {
				b.Fatalf("dropped %d", d)
			}
		})
	}
}

// BenchmarkRequestWriter_Fold folds 4096 journaled records into a full
// ledger (MaxRecords reached: each fold prunes as many as it adds), and
// into one with room. ns/op is per record.
func BenchmarkRequestWriter_Fold(b *testing.B) {
	const group = 4096
	for _, c := range []struct {
		name string
		full bool
	}{{name: "full", full: true}, {name: "room"}} {
		b.Run(c.name, func(b *testing.B) {
			s := openBenchStore(b)
			opts := DefaultRequestWriterOptions()
			opts.MaxRecords = 20_000
			if !c.full {
				opts.MaxRecords = 1 << 40
			}
			w := &RequestWriter{s: s, opts: opts}
			now := time.Now()
			seq := uint64(0)
			next := func() []journaled {
				entries := make([]journaled, group)
				buf := make([]byte, 0, group*512)
				for i := range entries {
					seq++
					r := benchRecord(int(seq), now)
					start := len(buf)
					buf, _ = appendRecord(buf, &r)
					entries[i] = journaled{seq: seq, deployment: r.Deployment, raw: buf[start:len(buf):len(buf)]}
				}
				return entries
			}
			// Fill the ledger to 20 000 records.
			for seq < 20_000 {
				if err := w.commit(next()); err != nil {
					b.Fatal(err)
				}
			}
			groups := make([][]journaled, (b.N+group-1)/group)
			for i := range groups {
				groups[i] = next()
			}
			b.ReportAllocs()
			b.ResetTimer()
			cpu := cpuNow()
			for _, g := range groups {
				if err := w.commit(g); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			n := len(groups) * group
			b.ReportMetric(float64(cpuNow()-cpu)/float64(n), "cpu-ns/record")
		})
	}
}

// BenchmarkRequestWriter_Write writes groups of 256 records to the journal.
// ns/op is per record.
func BenchmarkRequestWriter_Write(b *testing.B) {
	s := openBenchStore(b)
	opts := DefaultRequestWriterOptions()
	w := NewRequestWriter(s, opts)
	defer w.Close()
	// The writer's goroutine is left idle: write is called here, as run
	// calls it, and the tail is emptied between groups.
	batch := make([]structs.RequestRecord, 256)
	now := time.Now()
	for i := range batch {
		batch[i] = benchRecord(i, now)
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu := cpuNow()
	for i := 0; i < b.N; i += len(batch) {
		w.write(batch)
		w.tailMu.Lock()
		w.tail = nil
		w.tailMu.Unlock()
	}
	b.StopTimer()
	n := (b.N + len(batch) - 1) / len(batch) * len(batch)
	b.ReportMetric(float64(cpuNow()-cpu)/float64(n), "cpu-ns/record")
}

// BenchmarkSpin is the CPU of the spin alone, to subtract from
// BenchmarkRequestWriter_Record's paced figures.
func BenchmarkSpin(b *testing.B) {
	cpu := cpuNow()
	for i := 0; i < b.N; i++ {
		spin(100_000)
	}
	b.ReportMetric(float64(cpuNow()-cpu)/float64(b.N), "cpu-ns/op")
}
