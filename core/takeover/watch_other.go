// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build !unix

package takeover

import (
	"errors"
	"syscall"
)

// Supported: without a way to notice a hang-up outside net/http, every
// answer stays on net/http.
const Supported = false

// Watcher is never used where streams are not taken over.
type Watcher struct{}

// Wait is never called where streams are not taken over.
func (w *Watcher) Wait(syscall.RawConn, bool) (bool, bool, error) {
	return false, false, errors.New("takeover: unsupported on this system")
}
