// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// Each schema version has a database file under testdata/, written by the
// binary of that version, which the current binary must open and read.
// To add one when a migration lands (before changing anything else):
//
//	CAPYCTL_STORE_WRITE_TESTDATA=1 go test ./core/store -run TestWriteTestdata
//
// and commit testdata/v<N>.db.

var testdataTime = time.Date(2026, 10, 1, 12, 0, 0, 0, time.UTC)

// fillTestdata writes one record of every kind.
func fillTestdata(t *testing.T, s *Store) {
	t.Helper()
	rec := deployment("chat-small", 2)
	rec.Spec.Routes = []string{"chat-small", "chat"}
	for _, r := range []*structs.DeploymentRecord{deployment("chat-small", 1), rec} {
		if err := s.PutDeployment(r); err != nil {
			t.Fatal(err)
		}
	}
	steps := []func() error{
		func() error {
			return s.PutInstance(&structs.InstanceRecord{Deployment: "chat-small", Index: 0, Revision: 2, Generation: 3,
				State: structs.StateParked, Engine: "vllm-main", Driver: "vllm", Since: testdataTime,
				Launch: &structs.LaunchRecord{LaunchID: "launch-1", Pgid: 4242, Port: 8100,
					Processes: []structs.ProcessIdentity{{PID: 4242, StartTicks: 123456, Role: "api"}}}})
		},
		func() error {
			return s.PutEngine(&structs.EngineRecord{Name: "vllm-main", Family: "vllm", Path: "/opt/vllm", Version: "0.31.0",
				Verified: true, Digest: "sha256:00", AddedAt: testdataTime})
		},
		func() error {
			return s.PutReattach("vllm", ReattachRecord{Network: "unix", Addr: "/run/capyctl/vllm.sock", Pid: 77,
				StartTicks: 999, ProtocolVersion: 1, Program: "/usr/local/bin/capyctl", UpdatedAt: testdataTime})
		},
		func() error {
			return s.PutMeasurement("startup/chat-small/2/gpu0", Measurement{DeviceBytes: 11 << 30, HostBytes: 2 << 30,
				Provenance: "measured", At: testdataTime, Samples: 1})
		},
		func() error {
			return s.PutIdempotency("01J0000000000000000000000", IdempotencyRecord{BodyHash: "h", Status: 202,
				Response: []byte(`{"revision":"2"}`), At: testdataTime})
		},
		func() error {
			_, err := s.AppendEvent(&structs.Event{Kind: "deployment_created", Deployment: "chat-small"})
			return err
		},
		func() error { return s.SetMeta(MetaHostname, "gpu-a") },
		func() error {
			return s.Update(func(tx *Tx) error {
				return tx.PutResponses([]structs.StoredResponse{{ID: "resp_0000000000000000000000000000", Owner: "default",
					CreatedAt: testdataTime, Input: []byte(`[{"role":"user","content":"hello"}]`),
					Response: []byte(`{"id":"resp_0000000000000000000000000000","object":"response","output":[]}`)}})
			})
		},
		func() error {
			return s.UpdateFleet(func(st *FleetState) error { return st.Put("host/gpu-a", map[string]string{"name": "gpu-a"}) })
		},
	}
	for _, step := range steps {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	if CurrentSchemaVersion() >= 5 {
		if err := s.Update(func(tx *Tx) error {
			if err := tx.PutAPIKey(&structs.APIKey{Name: "bob", ID: "0123456789ab", Digest: "sha256:" + strings.Repeat("0", 64),
				Models: []string{"chat-*"}, Limits: structs.KeyLimits{RPM: 5}, CreatedAt: testdataTime}); err != nil {
				return err
			}
			if err := tx.PutKeyUses(map[string]structs.KeyUse{"0123456789ab": {Name: "bob", FirstUsedAt: testdataTime, LastUsedAt: testdataTime}}); err != nil {
				return err
			}
			return tx.AddUsage([]structs.KeyUsage{{Hour: testdataTime, Key: "bob", Model: "chat-small", Requests: 3,
				Errors: map[string]int64{"rate_limited": 1}, PromptTokens: 10, CompletionTokens: 20, RequestMs: 300}})
		}); err != nil {
			t.Fatal(err)
		}
	}
	w := NewRequestWriter(s, DefaultRequestWriterOptions())
	w.Record(request("chat-small", 0, testdataTime))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestWriteTestdata(t *testing.T) {
	if os.Getenv("CAPYCTL_STORE_WRITE_TESTDATA") == "" {
		t.Skip("set CAPYCTL_STORE_WRITE_TESTDATA=1 to write testdata/v<N>.db")
	}
	path := filepath.Join("testdata", "v"+strconv.Itoa(CurrentSchemaVersion())+".db")
	_ = os.Remove(path)
	s, err := Open(path, Options{Now: func() time.Time { return testdataTime }})
	if err != nil {
		t.Fatal(err)
	}
	fillTestdata(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", path)
}

// copyTestdata copies a committed database into a temporary directory, so
// that opening (and migrating) it leaves the committed file alone.
func copyTestdata(t *testing.T, name string) string {
	t.Helper()
	src, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	path := PathIn(t.TempDir())
	dst, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestStore_OpenOldVersions(t *testing.T) {
	cases := []struct {
		name string
		file string
		// responses says whether the file holds a stored response (v3 on).
		responses bool
		// keys says whether it holds an API key and its usage (v5 on).
		keys bool
	}{
		{name: "schema v1", file: "v1.db"},
		{name: "schema v2", file: "v2.db"},
		{name: "schema v3", file: "v3.db", responses: true},
		{name: "schema v4", file: "v4.db", responses: true},
		{name: "schema v5", file: "v5.db", responses: true, keys: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := copyTestdata(t, c.file)
			// The clock stays at the time the file was written so that
			// the idempotency receipt has not expired.
			s, err := Open(path, Options{Now: func() time.Time { return testdataTime.Add(time.Hour) }})
			if err != nil {
				t.Fatalf("open %s: %v", c.file, err)
			}
			defer s.Close()
			if v, _ := s.SchemaVersion(); v != CurrentSchemaVersion() {
				t.Errorf("schema version after open = %d, want %d", v, CurrentSchemaVersion())
			}
			if s.Incarnation() == "" {
				t.Errorf("incarnation %q", s.Incarnation())
			}
			dep, err := s.GetDeployment("chat-small")
			if err != nil || dep.Revision != 2 || len(dep.Spec.Routes) != 2 {
				t.Errorf("deployment = %+v, %v", dep, err)
			}
			if revs, _ := s.ListRevisions("chat-small"); len(revs) != 2 {
				t.Errorf("revisions = %d, want 2", len(revs))
			}
			in, err := s.GetInstance("chat-small", 0)
			if err != nil || in.State != structs.StateParked || in.Launch == nil || in.Launch.Processes[0].StartTicks != 123456 {
				t.Errorf("instance = %+v, %v", in, err)
			}
			if e, err := s.GetEngine("vllm-main"); err != nil || e.Version != "0.31.0" {
				t.Errorf("engine = %+v, %v", e, err)
			}
			if r, err := s.GetReattach("vllm"); err != nil || r.Pid != 77 || r.Driver != "vllm" {
				t.Errorf("reattach = %+v, %v", r, err)
			}
			if m, err := s.GetMeasurement("startup/chat-small/2/gpu0"); err != nil || m.DeviceBytes != 11<<30 {
				t.Errorf("measurement = %+v, %v", m, err)
			}
			if r, err := s.GetIdempotency("01J0000000000000000000000"); err != nil || r.Status != 202 {
				t.Errorf("idempotency = %+v, %v", r, err)
			}
			if ev, _ := s.EventsAfter(0, 0); len(ev) != 1 || ev[0].Kind != "deployment_created" {
				t.Errorf("events = %+v", ev)
			}
			if h, _ := s.Meta(MetaHostname); h != "gpu-a" {
				t.Errorf("hostname = %q", h)
			}
			if reqs, _ := s.ListRequests("chat-small", 10); len(reqs) != 1 {
				t.Errorf("requests = %+v", reqs)
			}
			r, err := s.GetResponse("resp_0000000000000000000000000000")
			switch {
			case c.responses && (err != nil || r.Owner != "default"):
				t.Errorf("stored response = %+v, %v", r, err)
			case !c.responses && !structs.HasCode(err, structs.CodeNotFound):
				t.Errorf("stored response in a file older than v3: %+v, %v", r, err)
			}
			keys, err := s.APIKeys()
			switch {
			case err != nil:
				t.Errorf("api keys: %v", err)
			case c.keys && (len(keys) != 1 || keys[0].Name != "bob" || keys[0].Limits.RPM != 5):
				t.Errorf("api keys = %+v", keys)
			case !c.keys && len(keys) != 0:
				t.Errorf("api keys in a file older than v5: %+v", keys)
			}
			rows, err := s.Usage(UsageFilter{})
			if err != nil || (c.keys && (len(rows) != 1 || rows[0].Tokens() != 30)) || (!c.keys && len(rows) != 0) {
				t.Errorf("usage = %+v, %v", rows, err)
			}
			// The file stays writable after the upgrade, keys and usage
			// included.
			if err := s.Update(func(tx *Tx) error {
				if err := tx.PutAPIKey(&structs.APIKey{Name: "new", ID: "ba9876543210", CreatedAt: testdataTime}); err != nil {
					return err
				}
				return tx.AddUsage([]structs.KeyUsage{{Hour: testdataTime, Key: "new", Model: "m", Requests: 1}})
			}); err != nil {
				t.Error(err)
			}
			// The file stays writable after the upgrade, responses included.
			if err := s.Update(func(tx *Tx) error {
				return tx.PutResponses([]structs.StoredResponse{{ID: "resp_new", Owner: "default", CreatedAt: testdataTime}})
			}); err != nil {
				t.Error(err)
			}
			if _, err := s.AppendEvent(&structs.Event{Kind: "upgraded"}); err != nil {
				t.Error(err)
			}
		})
	}
}
