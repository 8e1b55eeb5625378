// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package structs

import (
	"errors"
	"syscall"
)

// StorageRefused reports an error of a file system that refuses writes: a
// full disk or quota, a read-only or immutable file or file system, no
// permission, a failing device. Such a failure of the state store or the
// state directory is store_unavailable: the operator frees room or restores
// the file, and the same call then succeeds.
func StorageRefused(err error) bool {
	for _, e := range []syscall.Errno{syscall.ENOSPC, syscall.EDQUOT, syscall.EROFS, syscall.EPERM, syscall.EACCES, syscall.EIO} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
