// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build !linux

package store

import "os"

// journalSync: O_SYNC where O_DSYNC is not offered (it also syncs the
// file's times: slower, as safe).
const journalSync = os.O_SYNC
