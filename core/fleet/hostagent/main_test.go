// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package hostagent

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind: a
// host that closes gives back every goroutine it started.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
