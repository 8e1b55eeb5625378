// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package jobspec

import (
	"encoding/json"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/core/structs"
)

func TestFromJSON(t *testing.T) {
	d, err := FromJSON([]byte(`{"name": "a", "engine": "vllm", "model": {"path": "m"},
		"resources": {"phases": {"startup": {"gpu": "20GiB", "ram": "2GiB"}, "ready": {"gpu": "11GiB", "ram": "2GiB"}}},
		"engine_config": {"family": {"vllm": {"tool_call_parser": "auto"}}}}`))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		got   any
		want  any
		field string
		from  string
	}{
		{name: "default api", got: d.API, want: "chat", field: "api", from: FromDefault},
		{name: "default routes", got: strings.Join(d.Routes, ","), want: "a", field: "routes", from: FromDefault},
		{name: "engine from the document", got: d.Engine, want: "vllm", field: "engine", from: FromFile},
		{name: "phase size from a string", got: d.Resources.Phases["startup"].GPU, want: structs.ByteSize(20 * structs.GiB), field: "resources.startup.gpu", from: FromFile},
		{name: "family key", got: string(d.EngineConfig.Family["vllm"]), want: `{"tool_call_parser":"auto"}`, field: "engine_config.vllm.tool_call_parser", from: FromFile},
		{name: "default deadline", got: d.RequestDeadline, want: DefaultRequestDeadline, field: "request_deadline", from: FromDefault},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if !reflect.DeepEqual(c.got, c.want) {
				t.Errorf("value = %v, want %v", c.got, c.want)
			}
			if got := d.Provenance[c.field]; got != c.from {
				t.Errorf("provenance[%s] = %q, want %q", c.field, got, c.from)
			}
		})
	}
}

func TestFromJSON_RoundTrip(t *testing.T) {
	for _, file := range []string{"minimal.hcl", "full.hcl", "multi.hcl"} {
		t.Run(file, func(t *testing.T) {
			ds, err := ParseFile(filepath.Join("testdata", file))
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range ds {
				data, err := json.Marshal(d)
				if err != nil {
					t.Fatal(err)
				}
				back, err := FromJSON(data)
				if err != nil {
					t.Fatalf("FromJSON of a completed deployment: %v", err)
				}
				want := *d
				want.Provenance, back.Provenance = nil, nil
				if !reflect.DeepEqual(*back, want) {
					t.Errorf("round trip differs:\n got %+v\nwant %+v", *back, want)
				}
			}
		})
	}
}

func TestFromJSON_Invalid(t *testing.T) {
	cases := []struct {
		name     string
		doc      string
		contains string
		field    string
	}{
		{name: "not JSON", doc: `{"name": `, contains: "invalid deployment document"},
		{name: "unknown field", doc: `{"name": "a", "engine": "vllm", "model": {"path": "m"}, "colour": "red"}`, contains: `unknown field "colour"`},
		{name: "unknown nested field", doc: `{"name": "a", "engine": "vllm", "model": {"path": "m", "url": "x"}}`, contains: `unknown field "url"`},
		{name: "trailing data", doc: `{"name": "a", "engine": "vllm", "model": {"path": "m"}} {}`, contains: "data after"},
		{name: "explicit zero instances", doc: `{"name": "a", "engine": "vllm", "model": {"path": "m"}, "instances": 0}`, contains: "invalid instances", field: "instances"},
		{name: "explicit empty routes", doc: `{"name": "a", "engine": "vllm", "model": {"path": "m"}, "routes": []}`, contains: "at least one route", field: "routes"},
		{name: "bad size", doc: `{"name": "a", "engine": "vllm", "model": {"path": "m"}, "resources": {"gpu": "lots"}}`, contains: "size"},
		{name: "negative size", doc: `{"name": "a", "engine": "vllm", "model": {"path": "m"}, "resources": {"gpu": -5}}`, contains: "invalid resources.gpu", field: "resources.gpu"},
		{name: "unknown phase", doc: `{"name": "a", "engine": "vllm", "model": {"path": "m"}, "resources": {"phases": {"cold": {"gpu": 1}}}}`, contains: `phase "cold"`, field: "resources"},
		{name: "unknown family", doc: `{"name": "a", "engine": "vllm", "model": {"path": "m"}, "engine_config": {"family": {"ollama": {}}}}`, contains: `"ollama" is not an engine family`, field: "engine_config"},
		{name: "family not an object", doc: `{"name": "a", "engine": "vllm", "model": {"path": "m"}, "engine_config": {"family": {"vllm": [1]}}}`, contains: "must be an object", field: "engine_config.vllm"},
		{name: "explicit zero timeout", doc: `{"name": "a", "engine": "vllm", "model": {"path": "m"}, "timeouts": {"wake": "0s"}}`, contains: "leave it out", field: "timeouts.wake"},
		{name: "missing name", doc: `{"engine": "vllm", "model": {"path": "m"}}`, contains: "needs a name", field: "name"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := FromJSON([]byte(c.doc))
			wantInvalid(t, err, "", c.contains)
			if c.field != "" {
				if got := structs.AsError(err).Details["field"]; got != c.field {
					t.Errorf("details.field = %v, want %s", got, c.field)
				}
			}
		})
	}
}

func TestValidate(t *testing.T) {
	ds, err := ParseFile(filepath.Join("testdata", "full.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	base := *ds[0]
	cases := []struct {
		name     string
		mut      func(d *structs.Deployment)
		contains string
	}{
		{name: "valid", mut: func(d *structs.Deployment) {}},
		{name: "instances", mut: func(d *structs.Deployment) { d.Instances = 0 }, contains: "invalid instances: 0 is outside 1..64"},
		{name: "api", mut: func(d *structs.Deployment) { d.API = "" }, contains: "invalid api"},
		{name: "activation", mut: func(d *structs.Deployment) { d.Lifecycle.Activation = "" }, contains: "invalid lifecycle.activation"},
		{name: "stream idle", mut: func(d *structs.Deployment) { d.Limits.StreamIdle = 0 }, contains: "invalid limits.stream_idle"},
		{name: "negative timeout", mut: func(d *structs.Deployment) { d.Timeouts.Stop = -1 }, contains: "invalid timeouts.stop: must not be negative"},
		{name: "concurrency", mut: func(d *structs.Deployment) { d.EngineConfig.MaxConcurrentRequests = 1025 }, contains: "outside 1..1024"},
		{name: "hf and path", mut: func(d *structs.Deployment) { d.Model.Path = "m" }, contains: "exclude each other"},
		{name: "env value too long", mut: func(d *structs.Deployment) {
			d.EngineConfig.Env = map[string]string{"X": strings.Repeat("x", MaxEnvValueBytes+1)}
		}, contains: "the value of X"},
		{name: "kv cache beyond request", mut: func(d *structs.Deployment) { d.EngineConfig.Memory.KVCache = 100 * structs.ByteSize(structs.GiB) }, contains: "larger than the whole request"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := base
			d.EngineConfig.Env = map[string]string{"A": "b"}
			c.mut(&d)
			err := Validate(&d)
			if c.contains == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			wantInvalid(t, err, "invalid ", c.contains)
		})
	}
	if err := Validate(nil); !structs.HasCode(err, structs.CodeInvalidConfig) {
		t.Errorf("Validate(nil) = %v", err)
	}
}

func TestCheckConflicts(t *testing.T) {
	mk := func(name string, routes ...string) *structs.Deployment {
		return &structs.Deployment{Name: name, Routes: routes}
	}
	cases := []struct {
		name     string
		ds       []*structs.Deployment
		contains string
	}{
		{name: "disjoint", ds: []*structs.Deployment{mk("a", "a", "x"), mk("b", "b")}},
		{name: "same name", ds: []*structs.Deployment{mk("a", "a"), mk("a", "z")}, contains: "already declared"},
		{name: "shared route", ds: []*structs.Deployment{mk("a", "a", "chat"), mk("b", "b", "chat")}, contains: `route "chat" is already served by deployment "a"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := CheckConflicts(c.ds)
			if c.contains == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			wantInvalid(t, err, "", c.contains)
		})
	}
}
