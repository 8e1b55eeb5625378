// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package admission

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a goroutine outlives its tests: every
// goroutine the package starts has an owner that stops it.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
