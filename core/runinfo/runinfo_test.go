// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package runinfo

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestCredentials_RoundTrip(t *testing.T) {
	dir := t.TempDir()
	if _, err := ReadCredentials(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("no file: err = %v, want not exist", err)
	}
	want := &Credentials{APIKey: "capy-k", AdminToken: "capyadm-t"}
	if err := WriteCredentials(dir, want); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, CredentialsFile))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("credentials file: %v %v, want mode 0600", st, err)
	}
	got, err := ReadCredentials(dir)
	if err != nil || *got != *want {
		t.Fatalf("read %+v %v, want %+v", got, err, want)
	}
	if err := os.WriteFile(filepath.Join(dir, CredentialsFile), []byte("api_key: only\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadCredentials(dir); err == nil {
		t.Fatal("an incomplete credentials file was accepted")
	}
}

func TestRunInfo_RoundTrip(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "run"), 0o700); err != nil {
		t.Fatal(err)
	}
	want := RunInfo{Role: "standalone", PID: 42, Management: "127.0.0.1:7443", Inference: "127.0.0.1:8443",
		StartedAt: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC), Version: "1.2.3", Host: "h"}
	if err := WriteRunInfo(dir, want); err != nil {
		t.Fatal(err)
	}
	got, err := ReadRunInfo(dir)
	if err != nil || *got != want {
		t.Fatalf("read %+v %v, want %+v", got, err, want)
	}
	RemoveRunInfo(dir)
	if _, err := ReadRunInfo(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("after remove: err = %v, want not exist", err)
	}
}
