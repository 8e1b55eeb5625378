// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router_test

import (
	"context"
	"encoding/json"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden files under testdata/dialects")

// toolIDs are the fake vLLM's call IDs, fresh for every call.
var toolIDs = regexp.MustCompile(`"(id|call_id)":"chatcmpl-tool-[0-9a-f]+"`)

// startTokens is message_start's prompt count.
var startTokens = regexp.MustCompile(`"input_tokens":[0-9]+`)

// vllmFake is the testkit's fake vLLM answering tokens pieces.
func vllmFake(tokens int) fakeengine.Config {
	return fakeengine.Config{Flavour: fakeengine.NewVLLM(fakeengine.VLLMOptions{}), Tokens: tokens}
}

// scriptedEngine answers every POST with one scripted answer and keeps
// what it was sent: the translation's both directions under a test's
// control (the engine's own chunks, its own quirks).
type scriptedEngine struct {
	srv    *httptest.Server
	status int
	ctype  string
	answer string

	mu     sync.Mutex
	paths  []string
	bodies []string
}

func newScriptedEngine(t *testing.T, status int, ctype, answer string) *scriptedEngine {
	t.Helper()
	s := &scriptedEngine{status: status, ctype: ctype, answer: answer}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.paths = append(s.paths, r.URL.Path)
		s.bodies = append(s.bodies, string(b))
		answer := s.answer
		s.mu.Unlock()
		w.Header().Set("Content-Type", s.ctype)
		w.WriteHeader(s.status)
		_, _ = io.WriteString(w, answer)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

// setAnswer changes the scripted answer for the next requests.
func (s *scriptedEngine) setAnswer(a string) {
	s.mu.Lock()
	s.answer = a
	s.mu.Unlock()
}

func (s *scriptedEngine) last() (string, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.paths) == 0 {
		return "", ""
	}
	return s.paths[len(s.paths)-1], s.bodies[len(s.bodies)-1]
}

// sse joins data payloads (and named events) into an event stream.
func sse(events ...string) string {
	var b strings.Builder
	for _, e := range events {
		if name, data, ok := strings.Cut(e, "|"); ok && !strings.HasPrefix(e, "{") {
			b.WriteString("event: " + name + "\ndata: " + data + "\n\n")
			continue
		}
		b.WriteString("data: " + e + "\n\n")
	}
	return b.String()
}

// volatile are the members whose values differ from run to run (IDs that
// carry the request's, times); they read "<id>" and "<time>" in goldens.
var volatile = map[string]string{"id": "<id>", "item_id": "<id>", "created_at": "<time>", "request_id": "<id>", "created": "<time>"}

// normalize is a JSON value with its volatile members replaced, CapyCTL's
// metrics and the engine's request ID dropped, keys sorted.
func normalize(raw string) string {
	var v any
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		return raw
	}
	var walk func(v any) any
	walk = func(v any) any {
		switch x := v.(type) {
		case map[string]any:
			for k, val := range x {
				switch {
				case k == "capyctl" || k == "rid":
					delete(x, k)
				case volatile[k] != "":
					if s, ok := val.(string); ok && (k != "id" || !strings.HasPrefix(s, "call_") && !strings.HasPrefix(s, "toolu_")) {
						x[k] = volatile[k]
					} else if _, ok := val.(float64); ok {
						x[k] = volatile[k]
					}
				default:
					x[k] = walk(val)
				}
			}
			return x
		case []any:
			for i := range x {
				x[i] = walk(x[i])
			}
		}
		return v
	}
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(walk(v))
	return strings.TrimSuffix(b.String(), "\n")
}

// clientEvents is a stream as the golden files show it: one line per
// event, "<name> <normalized data>"; comments left out.
func clientEvents(body string) []string {
	var out []string
	name := ""
	for _, l := range strings.Split(body, "\n") {
		switch {
		case strings.HasPrefix(l, "event: "):
			name = strings.TrimPrefix(l, "event: ")
		case strings.HasPrefix(l, "data: "):
			d := strings.TrimPrefix(l, "data: ")
			if name == "" {
				name = "data"
			}
			out = append(out, name+" "+normalize(d))
			name = ""
		}
	}
	return out
}

// checkGolden compares got with testdata/dialects/<name>.golden
// (go test -run TestDialects_Golden -update rewrites it).
func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", "dialects", name+".golden")
	if *updateGolden {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test ./core/router -run TestDialects_Golden -update writes it)", err)
	}
	if string(want) != got {
		t.Errorf("%s differs from the golden file:\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// Scripted engine answers: chat completion streams as the engines send
// them, and the engines' own Messages and Responses streams.
var (
	chatText = sse(
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9,"prompt_tokens_details":{"cached_tokens":3}}}`,
		`[DONE]`)
	// chatToolCall is a call streamed as vLLM does: id, type and name
	// first, then the arguments in pieces.
	chatToolCall = sse(
		`{"id":"chatcmpl-2","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":null},"finish_reason":null}]}`,
		`{"id":"chatcmpl-2","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]},"finish_reason":null}]}`,
		`{"id":"chatcmpl-2","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]},"finish_reason":null}]}`,
		`{"id":"chatcmpl-2","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]},"finish_reason":null}]}`,
		`{"id":"chatcmpl-2","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
		`{"id":"chatcmpl-2","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":30,"completion_tokens":9,"total_tokens":39}}`,
		`[DONE]`)
	// chatParallel is two calls in one answer, then text (llama-server
	// style: no role chunk, usage on the finish chunk).
	chatParallel = sse(
		`{"id":"chatcmpl-3","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},"finish_reason":null}]}`,
		`{"id":"chatcmpl-3","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"get_time","arguments":"{}"}}]},"finish_reason":null}]}`,
		`{"id":"chatcmpl-3","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":40,"completion_tokens":12,"total_tokens":52},"timings":{"prompt_ms":3.5,"predicted_per_second":80}}`,
		`[DONE]`)
	// chatReasoning separates the reasoning (vLLM's reasoning parser),
	// ends at a stop string (vLLM's stop_reason) and has no usage.
	chatReasoning = sse(
		`{"id":"chatcmpl-4","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","reasoning_content":"Think"},"finish_reason":null}]}`,
		`{"id":"chatcmpl-4","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"reasoning_content":"ing."},"finish_reason":null}]}`,
		`{"id":"chatcmpl-4","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Answer"},"finish_reason":null}]}`,
		`{"id":"chatcmpl-4","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop","stop_reason":"END"}]}`,
		`[DONE]`)
	chatLength = sse(
		`{"id":"chatcmpl-5","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"Cut"},"finish_reason":null}]}`,
		`{"id":"chatcmpl-5","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}`,
		`{"id":"chatcmpl-5","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`,
		`[DONE]`)
	// nativeMessages is vLLM's own Messages stream (message_stream_converter).
	nativeMessages = sse(
		`message_start|{"type":"message_start","message":{"id":"chatcmpl-9","type":"message","role":"assistant","content":[],"model":"m","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":7,"output_tokens":0}}}`,
		`content_block_start|{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
		`content_block_delta|{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}`,
		`content_block_delta|{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"lo"}}`,
		`content_block_stop|{"type":"content_block_stop","index":0}`,
		`content_block_start|{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"call_1","name":"get_weather","input":{}}}`,
		`content_block_delta|{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"city\":"}}`,
		`content_block_delta|{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"\"Paris\"}"}}`,
		`content_block_stop|{"type":"content_block_stop","index":1}`,
		`message_delta|{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"input_tokens":7,"output_tokens":11}}`,
		`message_stop|{"type":"message_stop"}`)
	// nativeResponses is vLLM's own Responses stream (text, then a call).
	nativeResponses = sse(
		`response.created|{"type":"response.created","sequence_number":0,"response":{"id":"resp_x","status":"in_progress","output":[]}}`,
		`response.in_progress|{"type":"response.in_progress","sequence_number":1,"response":{"id":"resp_x","status":"in_progress","output":[]}}`,
		`response.output_item.added|{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"msg_x","type":"message","status":"in_progress","role":"assistant","content":[]}}`,
		`response.content_part.added|{"type":"response.content_part.added","sequence_number":3,"item_id":"msg_x","output_index":0,"content_index":0,"part":{"type":"output_text","text":""}}`,
		`response.output_text.delta|{"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_x","output_index":0,"content_index":0,"delta":"Hel"}`,
		`response.output_text.delta|{"type":"response.output_text.delta","sequence_number":5,"item_id":"msg_x","output_index":0,"content_index":0,"delta":"lo"}`,
		`response.output_text.done|{"type":"response.output_text.done","sequence_number":6,"item_id":"msg_x","output_index":0,"content_index":0,"text":"Hello"}`,
		`response.output_item.done|{"type":"response.output_item.done","sequence_number":7,"output_index":0,"item":{"id":"msg_x","type":"message"}}`,
		`response.output_item.added|{"type":"response.output_item.added","sequence_number":8,"output_index":1,"item":{"id":"fc_x","type":"function_call","call_id":"call_1","name":"get_weather","arguments":""}}`,
		`response.function_call_arguments.done|{"type":"response.function_call_arguments.done","sequence_number":9,"item_id":"fc_x","output_index":1,"arguments":"{\"city\":\"Paris\"}"}`,
		`response.completed|{"type":"response.completed","sequence_number":10,"response":{"id":"resp_x","status":"completed","usage":{"input_tokens":7,"output_tokens":11,"input_tokens_details":{"cached_tokens":0},"output_tokens_details":{"reasoning_tokens":0}}}}`)
)

const weatherTool = `{"type":"function","name":"get_weather","description":"The weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}`
const weatherToolAnthropic = `{"name":"get_weather","description":"The weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}`

// TestDialects_Golden: each API's requests as the engine gets them
// (translated to chat, or the engine's own route) and the engine's
// answers as the client gets them, against golden files.
func TestDialects_Golden(t *testing.T) {
	native := func(ep *structs.EngineEndpoint) {
		ep.MessagesPath, ep.ResponsesPath, ep.CountTokensPath = "/v1/messages", "/v1/responses", "/v1/messages/count_tokens"
	}
	cases := []struct {
		name   string
		path   string
		body   string
		engine string
		ep     func(*structs.EngineEndpoint)
	}{
		{name: "responses-text-stream", path: "/v1/responses", engine: chatText,
			body: `{"model":"demo","input":"Say hello","stream":true,"store":false,"temperature":0.5,"top_p":0.9,"max_output_tokens":20,"metadata":{"k":"v"},"user":"u1"}`},
		{name: "responses-text", path: "/v1/responses", engine: chatText,
			body: `{"model":"demo","instructions":"Be brief.","input":[{"role":"developer","content":"Speak English."},{"type":"message","role":"user","content":[{"type":"input_text","text":"Say "},{"type":"input_text","text":"hello"}]}],"text":{"format":{"type":"json_schema","name":"greeting","schema":{"type":"object"},"strict":true}},"reasoning":{"effort":"low"}}`},
		{name: "responses-tool-call-stream", path: "/v1/responses", engine: chatToolCall,
			body: `{"model":"demo","input":"Weather in Paris?","stream":true,"tools":[` + weatherTool + `],"tool_choice":{"type":"function","name":"get_weather"},"parallel_tool_calls":false}`},
		{name: "responses-tool-result", path: "/v1/responses", engine: chatText,
			body: `{"model":"demo","tools":[` + weatherTool + `],"input":[{"role":"user","content":"Weather in Paris?"},{"type":"reasoning","id":"rs_1","summary":[]},{"type":"function_call","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},{"type":"function_call","call_id":"call_2","name":"get_weather","arguments":"{\"city\":\"Lyon\"}"},{"type":"function_call_output","call_id":"call_1","output":"sunny"},{"type":"function_call_output","call_id":"call_2","output":[{"type":"input_text","text":"rain"}]}]}`},
		{name: "responses-reasoning-stream", path: "/v1/responses", engine: chatReasoning,
			body: `{"model":"demo","input":"Think first","stream":true}`},
		{name: "responses-incomplete", path: "/v1/responses", engine: chatLength,
			body: `{"model":"demo","input":"Go on","max_output_tokens":1}`},
		{name: "responses-native-stream", path: "/v1/responses", engine: nativeResponses, ep: native,
			body: `{"model":"demo","input":"Weather in Paris?","stream":true,"tools":[` + weatherTool + `]}`},
		{name: "messages-text-stream", path: "/v1/messages", engine: chatText,
			body: `{"model":"demo","max_tokens":20,"stream":true,"system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=1"},{"type":"text","text":"Be brief."}],"messages":[{"role":"user","content":"Say hello"}],"temperature":0.2,"top_p":0.8,"top_k":40,"metadata":{"user_id":"u"}}`},
		{name: "messages-stop-sequence", path: "/v1/messages", engine: chatReasoning,
			body: `{"model":"demo","max_tokens":20,"stop_sequences":["END"],"messages":[{"role":"user","content":"Think first"}]}`},
		{name: "messages-tool-use-stream", path: "/v1/messages", engine: chatToolCall,
			body: `{"model":"demo","max_tokens":64,"stream":true,"tools":[` + weatherToolAnthropic + `],"tool_choice":{"type":"any","disable_parallel_tool_use":true},"messages":[{"role":"user","content":"Weather in Paris?"}]}`},
		{name: "messages-parallel-tools", path: "/v1/messages", engine: chatParallel,
			body: `{"model":"demo","max_tokens":64,"tools":[` + weatherToolAnthropic + `],"tool_choice":{"type":"tool","name":"get_weather"},"messages":[{"role":"user","content":"Weather and time?"}]}`},
		{name: "messages-tool-result", path: "/v1/messages", engine: chatText,
			body: `{"model":"demo","max_tokens":64,"tools":[` + weatherToolAnthropic + `],"messages":[{"role":"user","content":"Weather in Paris?"},{"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"s"},{"type":"text","text":"Let me look."},{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"sunny"}]},{"type":"text","text":"Thanks"}]}]}`},
		{name: "messages-max-tokens", path: "/v1/messages", engine: chatLength,
			body: `{"model":"demo","max_tokens":1,"stream":true,"messages":[{"role":"user","content":"Go on"}]}`},
		{name: "messages-native-stream", path: "/v1/messages", engine: nativeMessages, ep: native,
			body: `{"model":"demo","max_tokens":64,"stream":true,"tools":[` + weatherToolAnthropic + `],"messages":[{"role":"user","content":"Weather in Paris?"}]}`},
		{name: "messages-native", path: "/v1/messages", engine: nativeMessages, ep: native,
			body: `{"model":"demo","max_tokens":64,"messages":[{"role":"user","content":"Weather in Paris?"}]}`},
		{name: "count-tokens-native", path: "/v1/messages/count_tokens", engine: `{"input_tokens":42}`, ep: native,
			body: `{"model":"demo","system":"Be brief.","tools":[` + weatherToolAnthropic + `],"messages":[{"role":"user","content":"Weather in Paris?"}]}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctype := "text/event-stream"
			if strings.HasPrefix(c.engine, "{") {
				ctype = "application/json"
			}
			eng := newScriptedEngine(t, 200, ctype, c.engine)
			e := newEnv(t, envOpts{ep: func(ep *structs.EngineEndpoint) {
				ep.BaseURL = eng.srv.URL
				ep.RequestIDField = "rid"
				if c.ep != nil {
					c.ep(ep)
				}
			}})
			resp, err := e.post(context.Background(), c.path, c.body, nil)
			if err != nil {
				t.Fatal(err)
			}
			body := readBody(t, resp)
			path, sent := eng.last()
			var b strings.Builder
			b.WriteString("# the client sends " + c.path + "\n" + normalize(c.body) + "\n")
			b.WriteString("# the engine gets " + path + "\n" + normalize(sent) + "\n")
			b.WriteString("# the client gets " + resp.Status + " " + resp.Header.Get("Content-Type") + "\n")
			if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
				b.WriteString(strings.Join(clientEvents(body), "\n") + "\n")
			} else {
				b.WriteString(normalize(body) + "\n")
			}
			checkGolden(t, c.name, b.String())
			if resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			if !strings.Contains(body, `"metrics"`) && !strings.Contains(body, "x-capyctl-metrics") {
				t.Errorf("no per-answer metrics: %s", body)
			}
		})
	}
}

// TestDialects_SameEventsNativeOrTranslated: a client sees the same events
// whether the engine serves its API or the router translates to chat. The
// engines are the testkit's fake vLLM, asked for text and for a function
// call (vLLM streams a call the same way on every route).
func TestDialects_SameEventsNativeOrTranslated(t *testing.T) {
	cases := []struct {
		name, path, body string
	}{
		{"messages text", "/v1/messages", `{"model":"demo","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"Hello"}]}`},
		{"messages tool use", "/v1/messages", `{"model":"demo","max_tokens":64,"stream":true,"tools":[` + weatherToolAnthropic + `],"messages":[{"role":"user","content":"get_weather for Paris"}]}`},
		{"messages whole", "/v1/messages", `{"model":"demo","max_tokens":5,"messages":[{"role":"user","content":"Hello"}]}`},
		{"responses text", "/v1/responses", `{"model":"demo","input":"Hello","stream":true,"max_output_tokens":5}`},
		{"responses tool call", "/v1/responses", `{"model":"demo","input":"get_weather for Paris","stream":true,"tools":[` + weatherTool + `]}`},
		{"responses whole", "/v1/responses", `{"model":"demo","input":"Hello","max_output_tokens":5}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got [2][]string
			for i, native := range []bool{false, true} {
				e := newEnv(t, envOpts{engine: vllmFake(5), ep: func(ep *structs.EngineEndpoint) {
					if native {
						ep.MessagesPath, ep.ResponsesPath = "/v1/messages", "/v1/responses"
					}
				}})
				resp, err := e.post(context.Background(), c.path, c.body, nil)
				if err != nil {
					t.Fatal(err)
				}
				body := readBody(t, resp)
				if resp.StatusCode != 200 {
					t.Fatalf("native %v: %d %s", native, resp.StatusCode, body)
				}
				lines := clientEvents(body)
				if len(lines) == 0 {
					lines = []string{normalize(body)}
				}
				for j := range lines {
					// The calls' IDs are the engine's, fresh each time.
					lines[j] = toolIDs.ReplaceAllString(lines[j], `"$1":"<call>"`)
					// A translated message_start cannot know the prompt's
					// tokens yet (chat reports usage at the end); vLLM's own
					// route knows them at once.
					if strings.HasPrefix(lines[j], "message_start ") {
						lines[j] = startTokens.ReplaceAllString(lines[j], `"input_tokens":0`)
					}
				}
				got[i] = lines
			}
			if strings.Join(got[0], "\n") != strings.Join(got[1], "\n") {
				t.Fatalf("translated and native differ:\n--- translated\n%s\n--- native\n%s", strings.Join(got[0], "\n"), strings.Join(got[1], "\n"))
			}
			names := map[string]bool{}
			for _, l := range got[0] {
				names[strings.Fields(l)[0]] = true
			}
			keys := make([]string, 0, len(names))
			for k := range names {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			t.Logf("%d events alike: %v", len(got[0]), keys)
		})
	}
}
