// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package hostagent

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/capyctl/capyctl/core/hostlink/proto/hostv1"
	"github.com/capyctl/capyctl/core/structs"
)

// journalLocal is a fakeLocal whose instances' journals are set by the
// test; its change signal never fires (a record write whose journal the
// link has not flushed yet).
type journalLocal struct {
	*fakeLocal
	mu       sync.Mutex
	journals []*hostv1.InstanceJournal
}

func (l *journalLocal) Journals() []*hostv1.InstanceJournal {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.journals
}

// sentStream is the host's end of a Connect stream that records what the
// host sends.
type sentStream struct {
	grpc.ClientStream
	mu   sync.Mutex
	sent []*hostv1.HostMessage
	got  chan struct{} // a message was sent
}

func (s *sentStream) Send(m *hostv1.HostMessage) error {
	s.mu.Lock()
	s.sent = append(s.sent, m)
	s.mu.Unlock()
	select {
	case s.got <- struct{}{}:
	default:
	}
	return nil
}

func (s *sentStream) Recv() (*hostv1.ServerMessage, error) { select {} }
func (s *sentStream) CloseSend() error                     { return nil }

func (s *sentStream) messages() []*hostv1.HostMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*hostv1.HostMessage(nil), s.sent...)
}

// TestLink_AnswerFollowsItsJournals: an answer the host queues for the
// server (a command's result) goes out after the journals of the record
// writes before it, even when the host's change signal has not fired
// yet: the server's group code reads members from the journals once it
// has a command's answer.
func TestLink_AnswerFollowsItsJournals(t *testing.T) {
	local := &journalLocal{fakeLocal: newFakeLocal()}
	h := &Host{o: HostOptions{Local: local}, logger: testLogger()}
	l := newServerLink("server:7445", true)
	stream := &sentStream{got: make(chan struct{}, 1)}
	ls := &linkSession{h: h, l: l, stream: stream, sent: map[string][32]byte{}, pending: map[uint64]uint64{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ls.run(ctx, time.Hour, make(chan uint64), make(chan error)) }()
	defer func() {
		cancel()
		<-done
	}()

	// The member parked (its record written), then the park's result.
	local.mu.Lock()
	local.journals = []*hostv1.InstanceJournal{{InstanceId: "big/0", Deployment: "big", State: string(structs.StateParked)}}
	local.mu.Unlock()
	l.out <- &hostv1.HostMessage{Body: &hostv1.HostMessage_Result{Result: &hostv1.CommandResult{CommandId: "park-1"}}}

	deadline := time.After(10 * time.Second)
	for {
		ms := stream.messages()
		if n := len(ms); n > 0 && ms[n-1].GetResult() != nil {
			if n < 2 || ms[n-2].GetJournal().GetState() != string(structs.StateParked) {
				t.Fatalf("the park's result went out before the member's parked journal: %v", ms)
			}
			return
		}
		select {
		case <-stream.got:
		case <-deadline:
			t.Fatalf("the result was never sent: %v", stream.messages())
		}
	}
}
