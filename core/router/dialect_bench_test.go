// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router_test

import (
	"context"
	"io"
	"testing"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
)

// BenchmarkDialects_Stream is one streamed answer of 64 pieces through the
// router from the in-process fake vLLM: chat completions relayed as they
// are (the baseline, same run), and the Responses and Messages APIs
// translated (chat chunks re-encoded) and native (the engine's own events
// re-encoded). It prints the cost of re-encoding against the relay.
func BenchmarkDialects_Stream(b *testing.B) {
	cases := []struct {
		name, path, body string
		native           bool
	}{
		{"chat", "/v1/chat/completions", `{"model":"demo","stream":true,"messages":[{"role":"user","content":"hello"}]}`, false},
		{"responses translated", "/v1/responses", `{"model":"demo","stream":true,"input":"hello"}`, false},
		{"responses native", "/v1/responses", `{"model":"demo","stream":true,"input":"hello"}`, true},
		{"messages translated", "/v1/messages", `{"model":"demo","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hello"}]}`, false},
		{"messages native", "/v1/messages", `{"model":"demo","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hello"}]}`, true},
	}
	for _, c := range cases {
		// One role per case, for every run of the case (the parent's
		// cleanup ends it).
		e := newEnv(b, envOpts{engine: fakeengine.Config{Flavour: fakeengine.NewVLLM(fakeengine.VLLMOptions{}), Tokens: 64},
			ep: func(ep *structs.EngineEndpoint) {
				if c.native {
					nativeEP(ep)
				}
			}})
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				resp, err := e.post(context.Background(), c.path, c.body, nil)
				if err != nil {
					b.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || len(body) == 0 {
					b.Fatalf("%d %s", resp.StatusCode, body)
				}
			}
		})
	}
}
