// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build !fleetfuture

package fleet

// afterJoin does nothing in a release build (future_on.go: the
// fleetfuture build's pretend newer release).
func (s *Server) afterJoin() {}
