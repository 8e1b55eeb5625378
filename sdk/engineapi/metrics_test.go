// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package engineapi

import (
	"math"
	"strings"
	"testing"
)

const vllmMetrics = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_running{engine="1",model_name="m"} 3.0
vllm:num_requests_running{model_name="other",engine="0"} 7.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 1234.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 5.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 5.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.25
`

const llamacppMetrics = "# HELP llamacpp:requests_processing Number of requests processing.\r\n" +
	"# TYPE llamacpp:requests_processing gauge\r\n" +
	"llamacpp:requests_processing 1\r\n" +
	"# HELP llamacpp:requests_deferred Number of requests deferred.\r\n" +
	"# TYPE llamacpp:requests_deferred gauge\r\n" +
	"llamacpp:requests_deferred 0\r\n"

const oddMetrics = `# A free comment
weird_label{path="C:\\dir",quote="say \"hi\"",nl="a\nb"} 1
nan_metric NaN
inf_metric +Inf
neg_inf_metric -Inf
with_ts{a="1"} 3 1700000000000
with_float_ts 4 1700000000.5
  indented_metric   5
trailing_comma{a="1",} 6
spaced { a = "1" , b="2" } 7
{"dotted.name", a="x"} 8
exemplar_total 9 # {trace_id="abc"} 1.0
sglang:num_queue_reqs{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"} 4
`

func TestMetrics_Value(t *testing.T) {
	cases := []struct {
		name   string
		input  string
		metric string
		labels map[string]string
		want   float64
		ok     bool
	}{
		{name: "vllm with labels", input: vllmMetrics, metric: "vllm:num_requests_running", labels: map[string]string{"model_name": "m", "engine": "1"}, want: 3, ok: true},
		{name: "labels in other order", input: vllmMetrics, metric: "vllm:num_requests_running", labels: map[string]string{"engine": "0", "model_name": "other"}, want: 7, ok: true},
		{name: "label subset takes the first", input: vllmMetrics, metric: "vllm:num_requests_running", labels: map[string]string{"model_name": "m"}, want: 2, ok: true},
		{name: "nil labels", input: vllmMetrics, metric: "vllm:num_requests_waiting", want: 1, ok: true},
		{name: "no such labels", input: vllmMetrics, metric: "vllm:num_requests_waiting", labels: map[string]string{"model_name": "x"}, ok: false},
		{name: "no such metric", input: vllmMetrics, metric: "vllm:nope", ok: false},
		{name: "counter without _total", input: vllmMetrics, metric: "vllm:prompt_tokens", want: 1234, ok: true},
		{name: "counter with _total", input: vllmMetrics, metric: "vllm:prompt_tokens_total", want: 1234, ok: true},
		{name: "histogram bucket", input: vllmMetrics, metric: "vllm:time_to_first_token_seconds_bucket", labels: map[string]string{"le": "+Inf"}, want: 5, ok: true},
		{name: "llama.cpp without labels", input: llamacppMetrics, metric: "llamacpp:requests_processing", want: 1, ok: true},
		{name: "llama.cpp zero", input: llamacppMetrics, metric: "llamacpp:requests_deferred", want: 0, ok: true},
		{name: "escaped label values", input: oddMetrics, metric: "weird_label", labels: map[string]string{"path": `C:\dir`, "quote": `say "hi"`, "nl": "a\nb"}, want: 1, ok: true},
		{name: "+Inf", input: oddMetrics, metric: "inf_metric", want: math.Inf(1), ok: true},
		{name: "-Inf", input: oddMetrics, metric: "neg_inf_metric", want: math.Inf(-1), ok: true},
		{name: "timestamp after value", input: oddMetrics, metric: "with_ts", want: 3, ok: true},
		{name: "float timestamp", input: oddMetrics, metric: "with_float_ts", want: 4, ok: true},
		{name: "indented", input: oddMetrics, metric: "indented_metric", want: 5, ok: true},
		{name: "trailing comma", input: oddMetrics, metric: "trailing_comma", labels: map[string]string{"a": "1"}, want: 6, ok: true},
		{name: "blanks in label set", input: oddMetrics, metric: "spaced", labels: map[string]string{"a": "1", "b": "2"}, want: 7, ok: true},
		{name: "quoted name", input: oddMetrics, metric: "dotted.name", labels: map[string]string{"a": "x"}, want: 8, ok: true},
		{name: "exemplar ignored", input: oddMetrics, metric: "exemplar", want: 9, ok: true},
		{name: "sglang queue", input: oddMetrics, metric: "sglang:num_queue_reqs", labels: map[string]string{"model_name": "m"}, want: 4, ok: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := ParseMetrics(strings.NewReader(c.input))
			if err != nil {
				t.Fatalf("ParseMetrics: %v", err)
			}
			got, ok := m.Value(c.metric, c.labels)
			if ok != c.ok || (ok && got != c.want) {
				t.Errorf("Value(%s, %v) = %v, %v; want %v, %v", c.metric, c.labels, got, ok, c.want, c.ok)
			}
		})
	}
}

func TestMetrics_NaNAndTimestamps(t *testing.T) {
	m, err := ParseMetrics(strings.NewReader(oddMetrics))
	if err != nil {
		t.Fatal(err)
	}
	v, ok := m.Value("nan_metric", nil)
	if !ok || !math.IsNaN(v) {
		t.Errorf("nan_metric = %v, %v", v, ok)
	}
	cases := []struct {
		name string
		want int64
	}{
		{name: "with_ts", want: 1700000000000},
		{name: "with_float_ts", want: 1700000000500},
		{name: "indented_metric", want: 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, s := range m.Samples {
				if s.Name == c.name && s.Timestamp != c.want {
					t.Errorf("timestamp %d, want %d", s.Timestamp, c.want)
				}
			}
		})
	}
}

func TestMetrics_Sum(t *testing.T) {
	m, err := ParseMetrics(strings.NewReader(vllmMetrics))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		metric string
		labels map[string]string
		want   float64
		ok     bool
	}{
		{name: "all label sets", metric: "vllm:num_requests_running", want: 12, ok: true},
		{name: "one model", metric: "vllm:num_requests_running", labels: map[string]string{"model_name": "m"}, want: 5, ok: true},
		{name: "counter suffix", metric: "vllm:prompt_tokens", want: 1234, ok: true},
		{name: "absent", metric: "vllm:absent", ok: false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got float64
			var ok bool
			if c.labels == nil {
				got, ok = m.Sum(c.metric)
			} else {
				got, ok = m.SumMatching(c.metric, c.labels)
			}
			if got != c.want || ok != c.ok {
				t.Errorf("got %v, %v; want %v, %v", got, ok, c.want, c.ok)
			}
		})
	}
	if m.Types["vllm:num_requests_running"] != "gauge" || m.Types["vllm:prompt_tokens"] != "counter" {
		t.Errorf("Types = %v", m.Types)
	}
	if m.Help["vllm:num_requests_waiting"] != "Number of requests waiting to be processed." {
		t.Errorf("Help = %q", m.Help["vllm:num_requests_waiting"])
	}
	if !m.Has("vllm:num_requests_waiting") || m.Has("vllm:absent") {
		t.Error("Has is wrong")
	}
}

func TestParseMetrics_Errors(t *testing.T) {
	cases := []struct {
		name  string
		input string
		good  string
	}{
		{name: "missing value", input: "good 1\nbad_metric\n", good: "good"},
		{name: "bad value", input: "bad_metric abc\ngood 1\n", good: "good"},
		{name: "unterminated labels", input: "bad{a=\"1\" 1\ngood 1\n", good: "good"},
		{name: "unquoted label value", input: "bad{a=1} 1\ngood 1\n", good: "good"},
		{name: "trailing text", input: "bad 1 2 3\ngood 1\n", good: "good"},
		{name: "bad name", input: "9bad 1\ngood 1\n", good: "good"},
		{name: "bad timestamp", input: "bad 1 x\ngood 1\n", good: "good"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := ParseMetrics(strings.NewReader(c.input))
			if err == nil {
				t.Fatal("no error for a malformed line")
			}
			if !strings.Contains(err.Error(), "line") {
				t.Errorf("error %q does not name the line", err)
			}
			if _, ok := m.Value(c.good, nil); !ok {
				t.Errorf("the good line was lost")
			}
			if len(m.Samples) != 1 {
				t.Errorf("samples %+v", m.Samples)
			}
		})
	}
}

func TestParseMetrics_EOF(t *testing.T) {
	m, err := ParseMetrics(strings.NewReader("a 1\n# EOF\nb 2\n"))
	if err != nil || !m.Has("a") || m.Has("b") {
		t.Errorf("got %+v, %v", m.Samples, err)
	}
}

func FuzzParseMetrics(f *testing.F) {
	for _, seed := range []string{vllmMetrics, llamacppMetrics, oddMetrics, "", "#", "{", "a{", `a{"b"} 1`, "a{b=\"\\", "a 1 # {x=\"y\"} 2 3"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, in string) {
		m, _ := ParseMetrics(strings.NewReader(in))
		for _, s := range m.Samples {
			if s.Name == "" {
				t.Fatalf("sample without a name from %q", in)
			}
			if _, ok := m.Value(s.Name, s.Labels); !ok {
				t.Fatalf("sample %q not found by its own name and labels", s.Name)
			}
		}
	})
}
