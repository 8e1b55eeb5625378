// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"reflect"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

func deployment(name string, rev uint64) *structs.DeploymentRecord {
	return &structs.DeploymentRecord{
		Name:     name,
		Revision: rev,
		Desired:  structs.DesiredOnDemand,
		Spec: structs.Deployment{
			Name: name, Engine: "vllm", API: structs.APIChat, Routes: []string{name}, Instances: 1,
			Model: structs.ModelSpec{Path: "qwen3-4b"},
		},
		CreatedAt: time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC),
		UpdatedAt: time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC),
	}
}

func TestStore_PutDeployment(t *testing.T) {
	cases := []struct {
		name    string
		rec     *structs.DeploymentRecord
		wantErr bool
	}{
		{name: "first revision", rec: deployment("chat", 1)},
		{name: "second revision", rec: deployment("chat", 2)},
		{name: "another deployment", rec: deployment("coder", 1)},
		{name: "nil", rec: nil, wantErr: true},
		{name: "no name", rec: &structs.DeploymentRecord{Revision: 1}, wantErr: true},
	}
	s, _ := newTestStore(t, Options{})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := s.PutDeployment(c.rec)
			if c.wantErr {
				if err == nil {
					t.Fatal("want an error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.GetDeployment(c.rec.Name)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.rec) {
				t.Errorf("GetDeployment = %+v, want %+v", got, c.rec)
			}
			rev, err := s.GetRevision(c.rec.Name, c.rec.Revision)
			if err != nil || rev.Revision != c.rec.Revision {
				t.Errorf("GetRevision = %+v, %v", rev, err)
			}
		})
	}
	list, err := s.ListDeployments()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Name != "chat" || list[0].Revision != 2 || list[1].Name != "coder" {
		t.Errorf("ListDeployments = %+v", list)
	}
	revs, err := s.ListRevisions("chat")
	if err != nil || len(revs) != 2 || revs[0].Revision != 1 || revs[1].Revision != 2 {
		t.Errorf("ListRevisions = %+v, %v", revs, err)
	}
}

func TestStore_GetDeployment(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	if err := s.PutDeployment(deployment("chat", 3)); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		dep  string
		rev  uint64
		want structs.Code
	}{
		{name: "present", dep: "chat", rev: 3},
		{name: "absent deployment", dep: "nope", rev: 1, want: structs.CodeNotFound},
		{name: "absent revision", dep: "chat", rev: 2, want: structs.CodeNotFound},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := s.GetRevision(c.dep, c.rev)
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if _, err := s.GetDeployment(c.dep); err != nil {
					t.Fatal(err)
				}
				return
			}
			wantCode(t, err, c.want)
		})
	}
	_, err := s.GetDeployment("nope")
	wantCode(t, err, structs.CodeNotFound)
}

func TestStore_DeleteDeployment(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	for _, r := range []*structs.DeploymentRecord{deployment("chat", 1), deployment("chat", 2), deployment("coder", 1)} {
		if err := s.PutDeployment(r); err != nil {
			t.Fatal(err)
		}
	}
	for _, in := range []*structs.InstanceRecord{
		{Deployment: "chat", Index: 0}, {Deployment: "chat", Index: 1}, {Deployment: "coder", Index: 0},
	} {
		if err := s.PutInstance(in); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name string
		dep  string
		want structs.Code
	}{
		{name: "present", dep: "chat"},
		{name: "twice", dep: "chat", want: structs.CodeNotFound},
		{name: "never there", dep: "nope", want: structs.CodeNotFound},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := s.DeleteDeployment(c.dep)
			if c.want != "" {
				wantCode(t, err, c.want)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
		})
	}
	if _, err := s.GetRevision("chat", 1); !structs.HasCode(err, structs.CodeNotFound) {
		t.Errorf("revision survived the delete: %v", err)
	}
	if list, _ := s.ListInstances("chat"); len(list) != 0 {
		t.Errorf("instances survived the delete: %+v", list)
	}
	if list, _ := s.AllInstances(); len(list) != 1 || list[0].Deployment != "coder" {
		t.Errorf("AllInstances = %+v, want coder/0 only", list)
	}
	if _, err := s.GetDeployment("coder"); err != nil {
		t.Errorf("the other deployment went too: %v", err)
	}
}

func TestStore_PutInstance(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	cases := []struct {
		name    string
		rec     *structs.InstanceRecord
		wantErr bool
	}{
		{name: "index 0", rec: &structs.InstanceRecord{Deployment: "b", Index: 0, State: structs.StateStarting}},
		{name: "index 10 sorts after 2", rec: &structs.InstanceRecord{Deployment: "b", Index: 10, State: structs.StateReady}},
		{name: "index 2", rec: &structs.InstanceRecord{Deployment: "b", Index: 2, State: structs.StateParked}},
		{name: "other deployment", rec: &structs.InstanceRecord{Deployment: "a", Index: 0, State: structs.StateStopped,
			Launch: &structs.LaunchRecord{LaunchID: "l1", Pgid: 42, Processes: []structs.ProcessIdentity{{PID: 42, StartTicks: 7, Role: "api"}}}}},
		{name: "overwrite", rec: &structs.InstanceRecord{Deployment: "b", Index: 0, State: structs.StateReady, Generation: 2}},
		{name: "negative index", rec: &structs.InstanceRecord{Deployment: "b", Index: -1}, wantErr: true},
		{name: "no deployment", rec: &structs.InstanceRecord{Index: 0}, wantErr: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := s.PutInstance(c.rec)
			if c.wantErr {
				if err == nil {
					t.Fatal("want an error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.GetInstance(c.rec.Deployment, c.rec.Index)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.rec) {
				t.Errorf("GetInstance = %+v, want %+v", got, c.rec)
			}
		})
	}
	list, err := s.ListInstances("b")
	if err != nil {
		t.Fatal(err)
	}
	var idx []int
	for _, r := range list {
		idx = append(idx, r.Index)
	}
	if !reflect.DeepEqual(idx, []int{0, 2, 10}) {
		t.Errorf("ListInstances order = %v, want [0 2 10]", idx)
	}
	all, _ := s.AllInstances()
	var ids []string
	for _, r := range all {
		ids = append(ids, r.ID())
	}
	if !reflect.DeepEqual(ids, []string{"a/0", "b/0", "b/2", "b/10"}) {
		t.Errorf("AllInstances = %v", ids)
	}
	if list, err := s.ListInstances("none"); err != nil || len(list) != 0 {
		t.Errorf("ListInstances(none) = %v, %v", list, err)
	}
}

func TestStore_DeleteInstance(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	for _, i := range []int{0, 1} {
		if err := s.PutInstance(&structs.InstanceRecord{Deployment: "a", Index: i}); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name  string
		dep   string
		index int
		want  structs.Code
	}{
		{name: "present", dep: "a", index: 1},
		{name: "again", dep: "a", index: 1, want: structs.CodeNotFound},
		{name: "unknown deployment", dep: "z", index: 0, want: structs.CodeNotFound},
		{name: "negative", dep: "a", index: -1, want: structs.CodeNotFound},
		{name: "last one", dep: "a", index: 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := s.DeleteInstance(c.dep, c.index)
			if c.want != "" {
				wantCode(t, err, c.want)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			_, err = s.GetInstance(c.dep, c.index)
			wantCode(t, err, structs.CodeNotFound)
		})
	}
	if all, _ := s.AllInstances(); len(all) != 0 {
		t.Errorf("AllInstances = %+v, want none", all)
	}
}

func TestStore_Engines(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	at := time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		name    string
		rec     *structs.EngineRecord
		wantErr bool
	}{
		{name: "vllm", rec: &structs.EngineRecord{Name: "vllm-main", Family: "vllm", Path: "/opt/vllm", Verified: true,
			Digest: "sha256:ab", Approvals: structs.Approvals{Env: []string{"HF_*"}}, AddedAt: at}},
		{name: "llamacpp", rec: &structs.EngineRecord{Name: "llama", Family: "llamacpp", Program: "/usr/bin/llama-server", AddedAt: at}},
		{name: "no name", rec: &structs.EngineRecord{Family: "vllm"}, wantErr: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := s.PutEngine(c.rec)
			if c.wantErr {
				if err == nil {
					t.Fatal("want an error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.GetEngine(c.rec.Name)
			if err != nil || !reflect.DeepEqual(got, c.rec) {
				t.Errorf("GetEngine = %+v, %v; want %+v", got, err, c.rec)
			}
		})
	}
	list, _ := s.ListEngines()
	if len(list) != 2 || list[0].Name != "llama" || list[1].Name != "vllm-main" {
		t.Errorf("ListEngines = %+v", list)
	}
	if err := s.DeleteEngine("llama"); err != nil {
		t.Fatal(err)
	}
	wantCode(t, s.DeleteEngine("llama"), structs.CodeNotFound)
	_, err := s.GetEngine("llama")
	wantCode(t, err, structs.CodeNotFound)
}

func TestStore_Reattach(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	at := time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		name    string
		driver  string
		rec     ReattachRecord
		want    ReattachRecord
		wantErr bool
	}{
		{name: "unix socket", driver: "vllm",
			rec:  ReattachRecord{Driver: "vllm", Network: "unix", Addr: "/run/p.sock", Pid: 10, StartTicks: 99, ProtocolVersion: 1, Program: "/bin/capyctl", UpdatedAt: at},
			want: ReattachRecord{Driver: "vllm", Network: "unix", Addr: "/run/p.sock", Pid: 10, StartTicks: 99, ProtocolVersion: 1, Program: "/bin/capyctl", UpdatedAt: at}},
		{name: "driver name filled in", driver: "sglang",
			rec:  ReattachRecord{Network: "tcp", Addr: "127.0.0.1:1234", Pid: 11},
			want: ReattachRecord{Driver: "sglang", Network: "tcp", Addr: "127.0.0.1:1234", Pid: 11}},
		{name: "empty driver", driver: "", wantErr: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := s.PutReattach(c.driver, c.rec)
			if c.wantErr {
				if err == nil {
					t.Fatal("want an error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.GetReattach(c.driver)
			if err != nil || !reflect.DeepEqual(*got, c.want) {
				t.Errorf("GetReattach = %+v, %v; want %+v", got, err, c.want)
			}
		})
	}
	list, _ := s.ListReattach()
	if len(list) != 2 || list[0].Driver != "sglang" || list[1].Driver != "vllm" {
		t.Errorf("ListReattach = %+v", list)
	}
	if err := s.DeleteReattach("vllm"); err != nil {
		t.Fatal(err)
	}
	wantCode(t, s.DeleteReattach("vllm"), structs.CodeNotFound)
	_, err := s.GetReattach("vllm")
	wantCode(t, err, structs.CodeNotFound)
}

func TestStore_Measurements(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	at := time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		name    string
		key     string
		m       Measurement
		wantErr bool
	}{
		{name: "startup peak", key: "startup/chat/1/gpu0", m: Measurement{DeviceBytes: 11 << 30, HostBytes: 2 << 30, Provenance: "measured", At: at, Samples: 1}},
		{name: "parked residue", key: "parked/chat/1/gpu0", m: Measurement{DeviceBytes: 600 << 20, Provenance: "measured", At: at, Samples: 3}},
		{name: "overwrite", key: "startup/chat/1/gpu0", m: Measurement{DeviceBytes: 12 << 30, Provenance: "measured", At: at, Samples: 2}},
		{name: "empty key", key: "", wantErr: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := s.PutMeasurement(c.key, c.m)
			if c.wantErr {
				if err == nil {
					t.Fatal("want an error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.GetMeasurement(c.key)
			if err != nil || !reflect.DeepEqual(*got, c.m) {
				t.Errorf("GetMeasurement = %+v, %v; want %+v", got, err, c.m)
			}
		})
	}
	all, err := s.ListMeasurements("startup/")
	if err != nil || len(all) != 1 || all["startup/chat/1/gpu0"].Samples != 2 {
		t.Errorf("ListMeasurements(startup/) = %+v, %v", all, err)
	}
	if err := s.DeleteMeasurement("parked/chat/1/gpu0"); err != nil {
		t.Fatal(err)
	}
	_, err = s.GetMeasurement("parked/chat/1/gpu0")
	wantCode(t, err, structs.CodeNotFound)
}

func TestStore_Idempotency(t *testing.T) {
	clock := newFakeClock()
	s, _ := newTestStore(t, Options{Now: clock.Now})
	cases := []struct {
		name    string
		key     string
		rec     IdempotencyRecord
		advance time.Duration
		found   bool
	}{
		{name: "fresh", key: "k1", rec: IdempotencyRecord{BodyHash: "h1", Status: 202, Response: []byte(`{"ok":true}`)}, found: true},
		{name: "23h later", key: "k2", rec: IdempotencyRecord{BodyHash: "h2", Status: 202}, advance: 23 * time.Hour, found: true},
		{name: "expired after 25h", key: "k3", rec: IdempotencyRecord{BodyHash: "h3", Status: 409}, advance: 25 * time.Hour, found: false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := s.PutIdempotency(c.key, c.rec); err != nil {
				t.Fatal(err)
			}
			clock.Advance(c.advance)
			got, err := s.GetIdempotency(c.key)
			if !c.found {
				wantCode(t, err, structs.CodeNotFound)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.BodyHash != c.rec.BodyHash || got.Status != c.rec.Status || string(got.Response) != string(c.rec.Response) {
				t.Errorf("GetIdempotency = %+v, want %+v", got, c.rec)
			}
			if got.At.IsZero() {
				t.Error("At not set")
			}
		})
	}
	// The next write prunes what expired: k1, k2 and k3 are older than 24 h.
	if err := s.PutIdempotency("k4", IdempotencyRecord{BodyHash: "h4"}); err != nil {
		t.Fatal(err)
	}
	err := s.View(func(tx *Tx) error {
		n := 0
		_ = tx.bucket(bucketIdempotency).ForEach(func(k, v []byte) error { n++; return nil })
		m := 0
		_ = tx.bucket(bucketIdempotencyTime).ForEach(func(k, v []byte) error { m++; return nil })
		if n != 1 || m != 1 {
			t.Errorf("after pruning: %d receipts, %d index entries; want 1 and 1 (k4)", n, m)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutIdempotency("", IdempotencyRecord{}); err == nil {
		t.Error("empty key accepted")
	}
}
