// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// TestRequestWriter_AFullQueueDropsExactlyTheRest: with the writer held at
// its first write, the queue takes exactly Buffer records; every other is
// dropped and counted, none waited for, and the queued ones are stored.
func TestRequestWriter_AFullQueueDropsExactlyTheRest(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	opts := DefaultRequestWriterOptions()
	opts.Buffer = 16
	opts.MaxBatch = 4
	opts.Interval = time.Millisecond
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	opts.beforeWrite = func() {
		once.Do(func() { close(held) })
		<-release
	}
	w := NewRequestWriter(s, opts)
	w.Record(request("first", 0, time.Now()))
	<-held // the writer holds "first" and nothing else
	const n = 100
	for i := 0; i < n; i++ {
		w.Record(request("a", i, time.Now()))
	}
	if got, want := w.Dropped(), uint64(n-opts.Buffer); got != want {
		t.Errorf("dropped %d of %d records with a %d-record queue, want %d", got, n, opts.Buffer, want)
	}
	close(release)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	got, _ := s.ListRequests("a", n)
	if len(got) != opts.Buffer || got[0].ID != fmt.Sprintf("a-%d", opts.Buffer-1) {
		t.Errorf("stored %v, want the first %d records", ids(got), opts.Buffer)
	}
}

// TestRequestWriter_CloseRacingRecord: Records racing Close neither panic
// nor vanish: each is stored (queued before Close) or dropped and counted.
func TestRequestWriter_CloseRacingRecord(t *testing.T) {
	for round := 0; round < 20; round++ {
		s, _ := newTestStore(t, Options{})
		opts := DefaultRequestWriterOptions()
		opts.MaxBatch = 8
		w := NewRequestWriter(s, opts)
		const goroutines, each = 4, 200
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g := 0; g < goroutines; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				<-start
				for i := 0; i < each; i++ {
					w.Record(request(fmt.Sprintf("d%d", g), i, time.Now()))
				}
			}(g)
		}
		close(start)
		time.Sleep(time.Duration(round) * 50 * time.Microsecond)
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		stored, err := s.ListRequests("", goroutines*each)
		if err != nil {
			t.Fatal(err)
		}
		if got := len(stored) + int(w.Dropped()); got != goroutines*each {
			t.Fatalf("round %d: stored %d + dropped %d = %d, want %d", round, len(stored), w.Dropped(), got, goroutines*each)
		}
	}
}

// TestRequestWriter_WritesWithoutFlush: without a Flush, a group is written
// as soon as MaxBatch records wait (the rest wait for the timer), and a
// lone record is written by the Interval timer, for the first group and
// for each after it.
func TestRequestWriter_WritesWithoutFlush(t *testing.T) {
	t.Run("MaxBatch", func(t *testing.T) {
		s, _ := newTestStore(t, Options{})
		opts := DefaultRequestWriterOptions()
		opts.Interval = time.Hour // only MaxBatch writes
		opts.FoldInterval = time.Hour
		opts.MaxBatch = 4
		w := NewRequestWriter(s, opts)
		defer w.Close()
		for i := 0; i < 10; i++ {
			w.Record(request("a", i, time.Now()))
		}
		// (write counts a write before it lists its records.)
		waitFor(t, "two full groups written", func() bool { return w.writes.Load() == 2 && w.tailLen() == 8 })
		for i := 10; i < 12; i++ {
			w.Record(request("a", i, time.Now()))
		}
		// The 2 left waiting and these 2 make a third group.
		waitFor(t, "a third group", func() bool { return w.writes.Load() == 3 && w.tailLen() == 12 })
	})
	t.Run("Interval", func(t *testing.T) {
		s, _ := newTestStore(t, Options{})
		opts := DefaultRequestWriterOptions()
		opts.Interval = 5 * time.Millisecond
		opts.FoldInterval = time.Hour
		w := NewRequestWriter(s, opts)
		defer w.Close()
		for i := 1; i <= 3; i++ {
			w.Record(request("a", i, time.Now()))
			waitFor(t, fmt.Sprintf("group %d written by the timer", i), func() bool {
				got, _ := s.ListRequests("a", 10)
				return w.writes.Load() == uint64(i) && len(got) == i
			})
		}
	})
}

// TestRecordDeployment: the deployment read without decoding the record is
// the one encoding/json reads, for records as appendRecord writes them
// (with a client request ID or not, names that need escaping, a key's text
// inside another field) and for records laid out otherwise (the fallback).
func TestRecordDeployment(t *testing.T) {
	at := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	enc := func(r structs.RequestRecord) string {
		b, err := appendRecord(nil, &r)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	cases := []struct {
		name, raw, want string
	}{
		{name: "plain", raw: enc(structs.RequestRecord{ID: "x", Deployment: "chat-small", ReceivedAt: at}), want: "chat-small"},
		{name: "client request id", raw: enc(structs.RequestRecord{ID: "x", ClientRequestID: "c-1", Deployment: "chat", ReceivedAt: at}), want: "chat"},
		{name: "no deployment", raw: enc(structs.RequestRecord{ID: "x", ReceivedAt: at}), want: ""},
		{name: "escaped quote", raw: enc(structs.RequestRecord{ID: "x", Deployment: `a"b`, ReceivedAt: at}), want: `a"b`},
		{name: "escaped backslash", raw: enc(structs.RequestRecord{ID: "x", Deployment: `a\b`, ReceivedAt: at}), want: `a\b`},
		{name: "html escaped", raw: enc(structs.RequestRecord{ID: "x", Deployment: "a<b>&c", ReceivedAt: at}), want: "a<b>&c"},
		{name: "unicode", raw: enc(structs.RequestRecord{ID: "x", Deployment: "模型-ü", ReceivedAt: at}), want: "模型-ü"},
		{name: "key text in the id", raw: enc(structs.RequestRecord{ID: `x,"deployment":"evil`, Deployment: "good", ReceivedAt: at}), want: "good"},
		{name: "key text in the client id", raw: enc(structs.RequestRecord{ID: "x", ClientRequestID: `,"deployment":"evil"`, Deployment: "good", ReceivedAt: at}), want: "good"},
		{name: "deployment first (fallback)", raw: `{"deployment":"first","id":"x"}`, want: "first"},
		{name: "spaces (fallback)", raw: `{"id":"x", "deployment": "spaced"}`, want: "spaced"},
		{name: "not json", raw: `garbage`, want: ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := recordDeployment([]byte(c.raw)); got != c.want {
				t.Errorf("recordDeployment(%s) = %q, want %q", c.raw, got, c.want)
			}
		})
	}
	// Every record appendRecord writes, as encoding/json reads it.
	rng := rand.New(rand.NewSource(7))
	for i := 0; i < 2000; i++ {
		r := randomRecord(rng)
		raw, err := appendRecord(nil, &r)
		if err != nil {
			continue
		}
		var head struct {
			Deployment string `json:"deployment"`
		}
		if err := json.Unmarshal(raw, &head); err != nil {
			t.Fatal(err)
		}
		if got := recordDeployment(raw); got != head.Deployment {
			t.Fatalf("recordDeployment(%s) = %q, encoding/json reads %q", raw, got, head.Deployment)
		}
	}
}

// TestRequestWriter_PruneRemovesTheIndex: records pruned from a full ledger
// leave no entry in their deployment's index, and a deployment left with no
// record loses its index bucket, whatever its name.
func TestRequestWriter_PruneRemovesTheIndex(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	opts := DefaultRequestWriterOptions()
	opts.MaxRecords = 6
	w := NewRequestWriter(s, opts)
	defer w.Close()
	deps := []string{"a", `quo"te`, "x<y>"}
	for i, d := range deps {
		w.Record(request(d, i, time.Now()))
		w.Record(request(d, i+10, time.Now()))
	}
	w.Flush()
	// Four records of "b" push out a's and quo"te's two each.
	for i := 0; i < 4; i++ {
		w.Record(request("b", i, time.Now()))
	}
	w.Flush()
	index := func() map[string]int {
		out := map[string]int{}
		_ = s.View(func(tx *Tx) error {
			return tx.bucket(bucketRequestsByDeploy).ForEachBucket(func(name []byte) error {
				n := 0
				_ = tx.bucket(bucketRequestsByDeploy).Bucket(name).ForEach(func(k, v []byte) error {
					n++
					return nil
				})
				out[string(name)] = n
				return nil
			})
		})
		return out
	}
	if got, want := fmt.Sprint(index()), fmt.Sprint(map[string]int{"b": 4, "x<y>": 2}); got != want {
		t.Errorf("index after pruning: %s, want %s", got, want)
	}
	// One more record of "b" prunes one of "x<y>": its index keeps one.
	w.Record(request("b", 4, time.Now()))
	w.Flush()
	if got, want := fmt.Sprint(index()), fmt.Sprint(map[string]int{"b": 5, "x<y>": 1}); got != want {
		t.Errorf("index after pruning one more: %s, want %s", got, want)
	}
}

// TestAppendTime_IsMarshalJSON: appendTime writes what time.Time's
// MarshalJSON writes, and fails where it fails (a year outside 0-9999, a
// zone offset of 24 hours or more).
func TestAppendTime_IsMarshalJSON(t *testing.T) {
	base := time.Date(2026, 12, 7, 1, 2, 3, 450_000_000, time.UTC)
	var times []time.Time
	for _, y := range []int{-1, 0, 1, 999, 2026, 9999, 10000, 123456} {
		times = append(times, base.AddDate(y-2026, 0, 0))
	}
	for _, off := range []int{0, 1, -1, 3600, 5*3600 + 1800, 23*3600 + 59*60, 24 * 3600, -24 * 3600, 100 * 3600, 17*60 + 30} {
		times = append(times, base.In(time.FixedZone("z", off)), base.AddDate(7973, 0, 0).In(time.FixedZone("z", off)))
	}
	times = append(times, time.Time{}, base.Add(1), base.Truncate(time.Second))
	for _, tm := range times {
		want, wantErr := tm.MarshalJSON()
		got, err := appendTime([]byte("x"), tm)
		if (err != nil) != (wantErr != nil) {
			t.Errorf("%v: error %v, MarshalJSON's %v", tm, err, wantErr)
			continue
		}
		if err == nil && string(got) != "x"+string(want) {
			t.Errorf("%v: %s, MarshalJSON writes %s", tm, got, want)
		}
	}
}
