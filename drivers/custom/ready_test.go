// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package custom

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/proc"
)

// readyEngine answers the readiness checks of a custom engine serving
// "m"; its model list waits for a chat request to arrive (at most hold),
// and says whether one did.
func readyEngine(t *testing.T, hold time.Duration, listed bool) (port int, chatDuringList chan bool) {
	t.Helper()
	chat := make(chan struct{}, 16)
	chatDuringList = make(chan bool, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
		case "/v1/models":
			select {
			case <-chat:
				chatDuringList <- true
			case <-time.After(hold):
				chatDuringList <- false
			}
			if listed {
				_, _ = w.Write([]byte(`{"data":[{"id":"m"}]}`))
			} else {
				_, _ = w.Write([]byte(`{"data":[{"id":"other"}]}`))
			}
		case "/v1/chat/completions":
			chat <- struct{}{}
			_, _ = w.Write([]byte(`{"choices":[{"message":{"role":"assistant","content":"ready"},"finish_reason":"stop"}]}`))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	_, p, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	port, _ = strconv.Atoi(p)
	return port, chatDuringList
}

// TestReadyOnce_AsksTheNameAndTheAnswerAtOnce: once the engine answers its
// health, the served name and the canary answer are asked together (a cold
// start waits for one round trip, not two), and both must pass.
func TestReadyOnce_AsksTheNameAndTheAnswerAtOnce(t *testing.T) {
	m := &Manifest{HealthPath: "/health", ChatPath: "/v1/chat/completions", ModelsPath: "/v1/models"}
	for _, c := range []struct {
		name   string
		listed bool
	}{{"listed", true}, {"not listed", false}} {
		t.Run(c.name, func(t *testing.T) {
			port, during := readyEngine(t, 5*time.Second, c.listed)
			h := newHandle("d/0", "l", proc.Launched{}, port, "", m, &sdk.Deployment{ServedName: "m"}, time.Second)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			ready, answer, why := h.readyOnce(ctx)
			if !<-during {
				t.Fatal("the model list was answered before any chat request arrived: the checks ran one after the other")
			}
			if ready != c.listed || (c.listed && answer != "ready") || (!c.listed && !strings.Contains(why, "waiting for m in")) {
				t.Fatalf("readyOnce = %v, %q, %q", ready, answer, why)
			}
		})
	}
}
