// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"

	"github.com/capyctl/capyctl/core/structs"
)

// TestDiskErr: a write the file system refuses is store_unavailable (exit
// 27, retryable); any other error passes unchanged.
func TestDiskErr(t *testing.T) {
	cases := []struct {
		name string
		err  error
		code structs.Code
	}{
		{"full disk", &os.PathError{Op: "write", Path: "capyctl.db", Err: syscall.ENOSPC}, structs.CodeStoreUnavailable},
		{"immutable file", fmt.Errorf("commit: %w", syscall.EPERM), structs.CodeStoreUnavailable},
		{"read-only file system", syscall.EROFS, structs.CodeStoreUnavailable},
		{"quota", syscall.EDQUOT, structs.CodeStoreUnavailable},
		{"a refusal of the caller's", structs.Errf(structs.CodeConflict, "no"), structs.CodeConflict},
		{"another error", errors.New("boom"), ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := diskErr(c.err)
			if !errors.Is(got, c.err) {
				t.Fatalf("the cause is lost: %v", got)
			}
			if c.code == "" {
				if got != c.err {
					t.Fatalf("changed: %v", got)
				}
				return
			}
			if !structs.HasCode(got, c.code) {
				t.Fatalf("%v: want code %s", got, c.code)
			}
		})
	}
	if info := structs.AsError(diskErr(syscall.ENOSPC)).Info(); info.Exit != 27 || !info.Retryable {
		t.Fatalf("catalogue row %+v", info)
	}
}

// TestDiskErr_StaysThroughAnInternalWrap: a caller that wraps a refused
// write as internal still answers store_unavailable.
func TestDiskErr_StaysThroughAnInternalWrap(t *testing.T) {
	err := structs.Wrap(structs.CodeInternal, diskErr(syscall.EPERM), "store deployment")
	if !structs.HasCode(err, structs.CodeStoreUnavailable) {
		t.Fatalf("%v: want store_unavailable", err)
	}
	if err := structs.Wrap(structs.CodeInternal, errors.New("x"), "y"); !structs.HasCode(err, structs.CodeInternal) {
		t.Fatalf("%v: want internal", err)
	}
}
