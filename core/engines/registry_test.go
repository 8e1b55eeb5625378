// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package engines

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk"
)

// detector is a driver whose Detect recognises the paths it is given.
type detector struct {
	sdk.UnimplementedDriver
	family string
	known  map[string]*sdk.DetectResponse
}

func (d *detector) Detect(_ context.Context, r *sdk.DetectRequest) (*sdk.DetectResponse, error) {
	if resp, ok := d.known[r.Path]; ok {
		return resp, nil
	}
	return nil, sdk.Errorf(string(structs.CodeEngineUnsupported), "not a %s installation", d.family)
}

type drivers map[string]sdk.Driver

func (d drivers) Driver(_ context.Context, family string) (sdk.Driver, error) {
	drv, ok := d[family]
	if !ok {
		return nil, structs.Errf(structs.CodeDriverUnavailable, "no %s driver", family)
	}
	return drv, nil
}
func (d drivers) Families() []string {
	out := make([]string, 0, len(d))
	for f := range d {
		out = append(out, f)
	}
	return out
}

type users map[string][]string

func (u users) UsesEngine(name string) []string { return u[name] }

func newRegistry(t *testing.T, u users) *Registry {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "capyctl.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	vllm := &detector{family: structs.FamilyVLLM, known: map[string]*sdk.DetectResponse{
		"/opt/vllm": {Family: structs.FamilyVLLM, Version: "0.32.0", Digest: "sha256:aa", Verified: true},
	}}
	llama := &detector{family: structs.FamilyLlamaCpp, known: map[string]*sdk.DetectResponse{
		"/opt/llama-server": {Family: structs.FamilyLlamaCpp, Version: "b4748", Digest: "sha256:bb"},
		"/opt/needs-tools":  {Family: structs.FamilyLlamaCpp, Digest: "sha256:cc", ToolchainMissing: []string{"nvcc"}},
	}}
	return New(st, drivers{structs.FamilyVLLM: vllm, structs.FamilyLlamaCpp: llama}, u)
}

// TestRegistry_Add: detection by the family named or in the detection
// order, the digest pinned, and every refusal with its code.
func TestRegistry_Add(t *testing.T) {
	cases := []struct {
		name   string
		req    AddRequest
		family string
		code   structs.Code
	}{
		{"detected in order", AddRequest{Path: "/opt/llama-server"}, structs.FamilyLlamaCpp, ""},
		{"family named", AddRequest{Path: "/opt/vllm", Family: structs.FamilyVLLM, Name: "v1"}, structs.FamilyVLLM, ""},
		{"nobody recognises it", AddRequest{Path: "/opt/other"}, "", structs.CodeEngineUnsupported},
		{"a bad name", AddRequest{Path: "/opt/vllm", Name: "Bad Name"}, "", structs.CodeInvalidRequest},
		{"the confirmed digest changed", AddRequest{Path: "/opt/vllm", ExpectDigest: "sha256:old"}, "", structs.CodeInstallationDrift},
		{"build tools missing", AddRequest{Path: "/opt/needs-tools"}, "", structs.CodeToolchainMissing},
		{"no such driver", AddRequest{Path: "/opt/vllm", Family: structs.FamilySGLang}, "", structs.CodeDriverUnavailable},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newRegistry(t, users{})
			got, err := r.Add(context.Background(), c.req)
			if c.code != "" {
				if !structs.HasCode(err, c.code) {
					t.Fatalf("err = %v, want %s", err, c.code)
				}
				if list, _ := r.List(); len(list) != 0 {
					t.Fatalf("a refused add registered %v", list)
				}
				return
			}
			if err != nil || !got.Registered || got.Record.Family != c.family || got.Record.Digest == "" {
				t.Fatalf("add: %+v, %v", got, err)
			}
			if _, err := r.Add(context.Background(), c.req); !structs.HasCode(err, structs.CodeEngineExists) {
				t.Fatalf("a second add: %v, want engine_exists", err)
			}
		})
	}
}

// TestRegistry_DryRunAndRemove: a dry run registers nothing; an engine a
// deployment uses is not removed; List names its users.
func TestRegistry_DryRunAndRemove(t *testing.T) {
	r := newRegistry(t, users{"vllm": {"chat"}})
	dry, err := r.Add(context.Background(), AddRequest{Path: "/opt/vllm", DryRun: true})
	if err != nil || dry.Registered {
		t.Fatalf("dry run: %+v, %v", dry, err)
	}
	if list, _ := r.List(); len(list) != 0 {
		t.Fatalf("a dry run registered %v", list)
	}
	if _, err := r.Add(context.Background(), AddRequest{Path: "/opt/vllm"}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Add(context.Background(), AddRequest{Path: "/opt/llama-server", Name: "llama"}); err != nil {
		t.Fatal(err)
	}
	list, err := r.List()
	if err != nil || len(list) != 2 || list[0].Name != "llama" || list[1].Name != "vllm" || len(list[1].UsedBy) != 1 {
		t.Fatalf("list %+v, %v", list, err)
	}
	if err := r.Remove("vllm"); !structs.HasCode(err, structs.CodeEngineInUse) {
		t.Fatalf("remove of a used engine: %v, want engine_in_use", err)
	}
	if err := r.Remove("nope"); !structs.HasCode(err, structs.CodeEngineNotFound) {
		t.Fatalf("remove of an unknown engine: %v, want engine_not_found", err)
	}
	if err := r.Remove("llama"); err != nil {
		t.Fatal(err)
	}
	if list, _ := r.List(); len(list) != 1 {
		t.Fatalf("after remove: %+v", list)
	}
}

// TestRegistry_Flags: a driver without a flag policy answers unsupported.
func TestRegistry_Flags(t *testing.T) {
	r := newRegistry(t, users{})
	if _, err := r.Flags(context.Background(), structs.FamilyVLLM); !structs.HasCode(err, structs.CodeUnsupported) {
		t.Fatalf("flags of a driver that has none: %v, want unsupported", err)
	}
}
