// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build fleetfuture

package fleet

import (
	"os"

	"github.com/capyctl/capyctl/core/fleet/fsm"
)

// afterJoin, in the fleetfuture build (a pretend newer release, for the
// rolling upgrade test), commits one command of a type release servers do
// not know once the server is in its cluster: CAPYCTL_FUTURE_COMMAND=note
// an ignorable one, =required one that is not. Its outcome is logged.
func (s *Server) afterJoin() {
	var c fsm.Command
	switch os.Getenv("CAPYCTL_FUTURE_COMMAND") {
	case "note":
		c = fsm.FutureNote{Note: "from a newer release"}
	case "required":
		c = fsm.FutureRequired{Note: "from a newer release"}
	default:
		return
	}
	if err := s.apply(c); err != nil {
		s.logger.Warn("future command refused", "type", c.CommandType(), "error", err)
		return
	}
	s.logger.Info("future command committed", "type", c.CommandType())
}
