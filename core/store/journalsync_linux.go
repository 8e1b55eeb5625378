// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import "syscall"

// journalSync makes each append to the request ledger's journal return
// once its bytes are on disk: one syscall where a write and an fdatasync
// were two.
const journalSync = syscall.O_DSYNC
