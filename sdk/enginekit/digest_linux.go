// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package enginekit

import (
	"os"
	"syscall"
)

// statKey is the open file's version (see FileDigest).
func statKey(f *os.File) (fileVersion, bool) {
	fi, err := f.Stat()
	if err != nil {
		return fileVersion{}, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileVersion{}, false
	}
	return fileVersion{
		dev: uint64(st.Dev), ino: uint64(st.Ino), size: st.Size,
		mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano(),
	}, true
}
