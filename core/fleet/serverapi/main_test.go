// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package serverapi

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind: a
// handler's fan-out to the hosts ends with the handler.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
