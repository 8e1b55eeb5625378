// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build !fleetfuture

package fsm

// extraTypes is empty in a release build; the fleetfuture build (extra_future.go)
// adds the command types of a pretend newer release, for the rolling
// upgrade test.
func extraTypes() map[Type]typeDef { return nil }
