// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
	bolt "go.etcd.io/bbolt"
)

// fakeClock is an injected clock a test moves by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 10, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// newTestStore opens a store in a temporary directory, closed at the end.
func newTestStore(t *testing.T, opts Options) (*Store, string) {
	t.Helper()
	path := PathIn(t.TempDir())
	s, err := Open(path, opts)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, path
}

func wantCode(t *testing.T, err error, code structs.Code) {
	t.Helper()
	if !structs.HasCode(err, code) {
		t.Fatalf("got error %v (code %q), want code %q", err, structs.CodeOf(err), code)
	}
}

func TestStore_Open(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	path := PathIn(dir)
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if mode := info.Mode().Perm(); mode != 0o600 {
		t.Errorf("file mode = %o, want 600", mode)
	}
	if info, _ := os.Stat(dir); info.Mode().Perm() != 0o700 {
		t.Errorf("dir mode = %o, want 700", info.Mode().Perm())
	}
	inc := s.Incarnation()
	if len(inc) != 26 || strings.Trim(inc, crockford) != "" {
		t.Errorf("incarnation %q, want 26 Crockford base32 digits", inc)
	}
	if v, err := s.SchemaVersion(); err != nil || v != CurrentSchemaVersion() {
		t.Errorf("schema version = %d, %v; want %d", v, err, CurrentSchemaVersion())
	}
	if err := s.PutEngine(&structs.EngineRecord{Name: "vllm-main", Family: "vllm"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s2, err := Open(path, Options{})
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer s2.Close()
	if s2.Incarnation() != inc {
		t.Errorf("incarnation changed on reopen: %q -> %q", inc, s2.Incarnation())
	}
	if _, err := s2.GetEngine("vllm-main"); err != nil {
		t.Errorf("record lost on reopen: %v", err)
	}
}

func TestStore_Open_Locked(t *testing.T) {
	_, path := newTestStore(t, Options{})
	if _, err := Open(path, Options{LockTimeout: 20 * time.Millisecond}); err == nil {
		t.Fatal("second open of a held store succeeded")
	}
}

func TestStore_Open_NewerSchema(t *testing.T) {
	s, path := newTestStore(t, Options{})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put([]byte(MetaSchemaVersion), []byte(strconv.Itoa(CurrentSchemaVersion()+1)))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = Open(path, Options{})
	wantCode(t, err, structs.CodeStoreFromNewerVersion)
	if exit := structs.AsError(err).Info().Exit; exit != 5 {
		t.Errorf("exit code = %d, want 5", exit)
	}
}

func TestStore_Open_Migrates(t *testing.T) {
	path2 := PathIn(t.TempDir())
	s1, err := Open(path2, Options{})
	if err != nil {
		t.Fatal(err)
	}
	inc := s1.Incarnation()
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	ran := 0
	migs := append(append([]migration(nil), migrations...), migration{
		version: CurrentSchemaVersion() + 1,
		name:    "test bucket",
		apply: func(tx *bolt.Tx) error {
			ran++
			_, err := tx.CreateBucket([]byte("test_v2"))
			return err
		},
	})
	s2, err := openWith(path2, Options{}, migs)
	if err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if v, _ := s2.SchemaVersion(); v != CurrentSchemaVersion()+1 {
		t.Errorf("schema version after migration = %d, want %d", v, CurrentSchemaVersion()+1)
	}
	if s2.Incarnation() != inc {
		t.Errorf("migration changed the incarnation")
	}
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
	// A second open runs nothing again.
	s3, err := openWith(path2, Options{}, migs)
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Close()
	if ran != 1 {
		t.Errorf("migration ran %d times, want 1", ran)
	}
}

func TestStore_Meta(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	cases := []struct {
		name    string
		key     string
		value   string
		wantErr bool
	}{
		{name: "free-form key", key: "cluster_id", value: "abc"},
		{name: "hostname", key: MetaHostname, value: "gpu-a"},
		{name: "schema version is the store's", key: MetaSchemaVersion, value: "9", wantErr: true},
		{name: "incarnation is the store's", key: MetaIncarnation, value: "x", wantErr: true},
		{name: "empty key", key: "", value: "x", wantErr: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := s.SetMeta(c.key, c.value)
			if c.wantErr {
				if err == nil {
					t.Fatal("want an error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.Meta(c.key)
			if err != nil || got != c.value {
				t.Errorf("Meta(%q) = %q, %v; want %q", c.key, got, err, c.value)
			}
		})
	}
	_, err := s.Meta("absent")
	wantCode(t, err, structs.CodeNotFound)
}

func TestStore_PinHostname(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	cases := []struct {
		name string
		host string
		want structs.Code
	}{
		{name: "first use pins", host: "gpu-a"},
		{name: "same name", host: "gpu-a"},
		{name: "another name is refused", host: "gpu-b", want: structs.CodeHostNameChanged},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := s.PinHostname(c.host)
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			wantCode(t, err, c.want)
		})
	}
}

func TestStore_Update_Atomic(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	ch, cancel := s.Subscribe()
	defer cancel()
	err := s.Update(func(tx *Tx) error {
		if err := tx.PutInstance(&structs.InstanceRecord{Deployment: "a", Index: 0, State: structs.StateReady}); err != nil {
			return err
		}
		if _, err := tx.AppendEvent(&structs.Event{Kind: "instance_ready", Deployment: "a"}); err != nil {
			return err
		}
		return errAbort
	})
	if err != errAbort {
		t.Fatalf("Update = %v, want errAbort", err)
	}
	if _, err := s.GetInstance("a", 0); !structs.HasCode(err, structs.CodeNotFound) {
		t.Errorf("instance written by a failed transaction: %v", err)
	}
	if seq, _ := s.LatestEventSeq(); seq != 0 {
		t.Errorf("event seq %d survived a failed transaction", seq)
	}
	select {
	case seq := <-ch:
		t.Errorf("subscriber woken (seq %d) by a failed transaction", seq)
	default:
	}

	err = s.Update(func(tx *Tx) error {
		if err := tx.PutInstance(&structs.InstanceRecord{Deployment: "a", Index: 0, State: structs.StateReady}); err != nil {
			return err
		}
		_, err := tx.AppendEvent(&structs.Event{Kind: "instance_ready", Deployment: "a"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if seq := <-ch; seq != 1 {
		t.Errorf("woken with seq %d, want 1", seq)
	}
	if _, err := s.GetInstance("a", 0); err != nil {
		t.Error(err)
	}
	err = s.View(func(tx *Tx) error { return tx.PutEngine(&structs.EngineRecord{Name: "x"}) })
	if err == nil {
		t.Error("a write inside View succeeded")
	}
}

var errAbort = errorString("abort")

type errorString string

func (e errorString) Error() string { return string(e) }
