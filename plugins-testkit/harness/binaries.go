// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package harness runs whole CapyCTL roles in tests: the real capyctl
// binary as a subprocess, with a private state directory, the testkit's
// fake engines registered through the same paths an operator uses, and
// helpers to call the CLI, the management API and the inference API, and to
// kill and restart processes. It is the one testkit package that may import
// core (for the API client and wire types).
package harness

import (
	"testing"

	"github.com/capyctl/capyctl/plugins-testkit/testbin"
)

// EnvBinDir names a directory holding prebuilt capyctl and
// capyctl-fake-engine binaries (make test sets it).
const EnvBinDir = testbin.EnvBinDir

// Binaries returns the paths of the capyctl and capyctl-fake-engine
// binaries (testbin.Binaries).
func Binaries(t testing.TB) (capyctl, fake string) {
	t.Helper()
	return testbin.Binaries(t)
}
