// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pki

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// TestJoinToken_WrongRoleNotBurned (L7): a server join token shown by a
// host, or a host's shown by a server, is refused and stays valid for the
// machine it was made for, in memory and in the token file.
func TestJoinToken_WrongRoleNotBurned(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tokens")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	file, err := NewFileStore(filepath.Join(dir, "tokens.json"))
	if err != nil {
		t.Fatal(err)
	}
	for name, store := range map[string]Store{"memory": NewMemStore(), "file": file} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, store)
			serverTok, err := f.auth.NewServerJoinToken(time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			hostTok, err := f.auth.NewJoinToken(time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			_, csr := newCSR(t, "gpu-a")
			if _, err := f.auth.Enroll(EnrollRequest{Token: serverTok, CSR: csr}); !structs.HasCode(err, structs.CodeJoinTokenInvalid) {
				t.Fatalf("a host with a server's token: %v, want join_token_invalid", err)
			}
			if err := f.auth.RedeemServerToken(hostTok); !structs.HasCode(err, structs.CodeJoinTokenInvalid) {
				t.Fatalf("a server with a host's token: %v, want join_token_invalid", err)
			}
			// Each still joins what it was made for, once.
			if err := f.auth.RedeemServerToken(serverTok); err != nil {
				t.Fatalf("the server token after a host showed it: %v", err)
			}
			if _, err := f.auth.Enroll(EnrollRequest{Token: hostTok, CSR: csr}); err != nil {
				t.Fatalf("the host token after a server showed it: %v", err)
			}
			if err := f.auth.RedeemServerToken(serverTok); !structs.HasCode(err, structs.CodeJoinTokenUsed) {
				t.Fatalf("the server token again: %v, want join_token_used", err)
			}
		})
	}
}
