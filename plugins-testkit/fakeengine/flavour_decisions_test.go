// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
	"github.com/capyctl/capyctl/sdk/decisions"
)

func TestDecisions_AnswersCompleteDeterministicSets(t *testing.T) {
	f, err := fakeengine.FlavourByName("decisions")
	if err != nil {
		t.Fatal(err)
	}
	e, err := fakeengine.New(fakeengine.Config{ServedName: "judge", Flavour: f, Stdout: io.Discard, Stderr: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := fakeengine.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go e.Serve(ctx, ln)
	<-e.Ready()
	url := "http://" + ln.Addr().String()

	lo, hi := 1, 5
	req := &decisions.Request{Model: "judge", State: "a calm sea", Questions: []decisions.Question{
		{ID: "a", Type: decisions.TypeNoul, Text: "Is the sea calm?"},
		{ID: "b", Type: decisions.TypeChoice, Text: "Which colour?", Options: []string{"blue", "grey", "green"}},
		{ID: "c", Type: decisions.TypeScore, Text: "How calm?", Min: &lo, Max: &hi},
	}}
	var answers []string
	for i := 0; i < 2; i++ {
		b, _ := json.Marshal(req)
		resp, err := http.Post(url+decisions.Path, "application/json", strings.NewReader(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		var out decisions.Response
		if err := json.Unmarshal(body, &out); err != nil {
			t.Fatal(err)
		}
		if err := decisions.Check(req, &out); err != nil {
			t.Fatalf("incomplete answer: %v\n%s", err, body)
		}
		if out.Object != decisions.Object || out.Usage.PromptTokens == 0 || out.Answers[2].Expected == nil {
			t.Fatalf("answer %s", body)
		}
		b2, _ := json.Marshal(out.Answers)
		answers = append(answers, string(b2))
	}
	if answers[0] != answers[1] {
		t.Fatalf("not deterministic:\n%s\n%s", answers[0], answers[1])
	}
	// The readiness question is answered too; chat is not served.
	rb, _ := json.Marshal(decisions.ReadinessRequest("judge"))
	resp, err := http.Post(url+decisions.Path, "application/json", strings.NewReader(string(rb)))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("readiness: %v %v", resp, err)
	}
	resp.Body.Close()
	resp, err = http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"judge","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil || resp.StatusCode != 404 {
		t.Fatalf("chat on a decision engine: %v %v", resp, err)
	}
	resp.Body.Close()
	// A bad request is refused with 400.
	resp, err = http.Post(url+decisions.Path, "application/json", strings.NewReader(`{"model":"judge","questions":[]}`))
	if err != nil || resp.StatusCode != 400 {
		t.Fatalf("bad request: %v %v", resp, err)
	}
	resp.Body.Close()
}
