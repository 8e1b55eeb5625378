// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build fleetfuture

package fsm

// The fleetfuture build pretends to be a newer release: it knows two
// command types today's release does not, one of them flagged ignorable.
// The rolling upgrade test (cmd/capyctl) runs it beside release servers
// to show that they skip the first and halt on the second.
const (
	// TypeFutureNote is a command older servers may skip.
	TypeFutureNote Type = "future_note"
	// TypeFutureRequired is a command older servers must not skip.
	TypeFutureRequired Type = "future_required"
)

// FutureNote is the ignorable command of the fleetfuture build.
type FutureNote struct {
	Note string `json:"note"`
}

// FutureRequired is the command of the fleetfuture build an older server
// cannot skip.
type FutureRequired struct {
	Note string `json:"note"`
}

func (FutureNote) CommandType() Type     { return TypeFutureNote }
func (FutureRequired) CommandType() Type { return TypeFutureRequired }

func extraTypes() map[Type]typeDef {
	return map[Type]typeDef{
		TypeFutureNote:     {version: 1, ignorable: true, decode: decodeAs[FutureNote]},
		TypeFutureRequired: {version: 1, decode: decodeAs[FutureRequired]},
	}
}
