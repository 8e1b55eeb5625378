// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"fmt"
	"sync"
	"testing"

	"github.com/capyctl/capyctl/core/structs"
)

func TestStore_Concurrent(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	const goroutines, each = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			dep := fmt.Sprintf("d%d", g)
			for i := 0; i < each; i++ {
				if err := s.PutInstance(&structs.InstanceRecord{Deployment: dep, Index: i, Generation: uint64(i)}); err != nil {
					errs <- err
					return
				}
				got, err := s.GetInstance(dep, i)
				if err != nil || got.Generation != uint64(i) {
					errs <- fmt.Errorf("get %s/%d = %+v, %v", dep, i, got, err)
					return
				}
				if _, err := s.AppendEvent(&structs.Event{Kind: "put", Deployment: dep}); err != nil {
					errs <- err
					return
				}
				if _, err := s.AllInstances(); err != nil {
					errs <- err
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	all, _ := s.AllInstances()
	if len(all) != goroutines*each {
		t.Errorf("%d instances, want %d", len(all), goroutines*each)
	}
	if seq, _ := s.LatestEventSeq(); seq != goroutines*each {
		t.Errorf("latest seq %d, want %d", seq, goroutines*each)
	}
	events, _ := s.EventsAfter(0, 0)
	for i, e := range events {
		if e.Seq != uint64(i+1) {
			t.Fatalf("event %d has seq %d: sequence not contiguous", i, e.Seq)
		}
	}
}
