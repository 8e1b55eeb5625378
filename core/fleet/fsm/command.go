// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fsm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// Type names a command.
type Type string

// The command types this release knows. IMPORTANT: a type's meaning never
// changes; a change of its body that an older server would misread is a
// new version (bump it in types), and a type an older server may skip is
// registered ignorable.
const (
	TypeHostJoined        Type = "host_joined"
	TypeHostDrain         Type = "host_drain"
	TypeHostRemoved       Type = "host_removed"
	TypePlaced            Type = "placed"
	TypeUnplaced          Type = "unplaced"
	TypeRestored          Type = "restored"
	TypeClusterConfigured Type = "cluster_configured"
)

// Command is one change of the state: a typed body.
type Command interface {
	// CommandType names the command's type.
	CommandType() Type
}

// HostJoined records a host that redeemed a join token.
type HostJoined struct {
	Host string `json:"host"`
}

// HostDrain stops (Drain) or resumes new placements on a host.
type HostDrain struct {
	Host  string `json:"host"`
	Drain bool   `json:"drain,omitempty"`
}

// HostRemoved forgets a host; refused while a placement names it.
type HostRemoved struct {
	Host string `json:"host"`
}

// Placed records a deployment's placement (a new one or a change). With
// Checked, it is refused (conflict) unless the placement's current version
// is Expect (0: there is none): two changes made from the same reading
// never both land.
type Placed struct {
	Placement *Placement `json:"placement"`
	Checked   bool       `json:"checked,omitempty"`
	Expect    uint64     `json:"expect,omitempty"`
}

// Unplaced forgets a deployment's placement.
type Unplaced struct {
	Deployment string `json:"deployment"`
}

// Restored replaces the whole state with a snapshot's (capyctl snapshot
// restore; a server's own state carried into the log when it first runs
// with raft, Carried).
type Restored struct {
	State   json.RawMessage `json:"state"`
	Carried bool            `json:"carried,omitempty"`
}

// ClusterConfigured records the cluster's own settings (the first
// server's bootstrap_expect, raised as servers join beyond it): every
// server reads them from the state, not from its own flags. Its Expect
// never lowers the recorded one.
type ClusterConfigured struct {
	Expect int `json:"expect"`
}

func (HostJoined) CommandType() Type        { return TypeHostJoined }
func (HostDrain) CommandType() Type         { return TypeHostDrain }
func (HostRemoved) CommandType() Type       { return TypeHostRemoved }
func (Placed) CommandType() Type            { return TypePlaced }
func (Unplaced) CommandType() Type          { return TypeUnplaced }
func (Restored) CommandType() Type          { return TypeRestored }
func (ClusterConfigured) CommandType() Type { return TypeClusterConfigured }

// typeDef is what a server knows of a type: the newest version it reads,
// whether it is written ignorable, and how to decode its body.
type typeDef struct {
	version   int
	ignorable bool
	decode    func(body []byte) (Command, error)
}

// decodeAs decodes a body into a T.
func decodeAs[T Command](body []byte) (Command, error) {
	var c T
	if err := json.Unmarshal(body, &c); err != nil {
		return nil, err
	}
	return c, nil
}

// types is every type this server reads and writes (plus those a build
// adds: extraTypes).
var types = func() map[Type]typeDef {
	m := map[Type]typeDef{
		TypeHostJoined:        {version: 1, decode: decodeAs[HostJoined]},
		TypeHostDrain:         {version: 1, decode: decodeAs[HostDrain]},
		TypeHostRemoved:       {version: 1, decode: decodeAs[HostRemoved]},
		TypePlaced:            {version: 1, decode: decodeAs[Placed]},
		TypeUnplaced:          {version: 1, decode: decodeAs[Unplaced]},
		TypeRestored:          {version: 1, decode: decodeAs[Restored]},
		TypeClusterConfigured: {version: 1, decode: decodeAs[ClusterConfigured]},
		TypeTokenCreated:      {version: 1, decode: decodeAs[TokenCreated]},
		TypeTokenRedeemed:     {version: 1, decode: decodeAs[TokenRedeemed]},
		TypeServerRemoved:     {version: 1, decode: decodeAs[ServerRemoved]},
		TypeServerAdmitted:    {version: 1, decode: decodeAs[ServerAdmitted]},
		TypeEngineRegistered:  {version: 1, decode: decodeAs[EngineRegistered]},
		TypeEngineRemoved:     {version: 1, decode: decodeAs[EngineRemoved]},
		TypeKeyCreated:        {version: 1, decode: decodeAs[KeyCreated]},
		TypeKeyUpdated:        {version: 1, decode: decodeAs[KeyUpdated]},
		TypeKeyRevoked:        {version: 1, decode: decodeAs[KeyRevoked]},
	}
	for t, d := range extraTypes() {
		m[t] = d
	}
	return m
}()

// Envelope is a command as the log holds it.
type Envelope struct {
	Op Type `json:"op"`
	// V is the body's version (0: a record of the first releases, whose
	// fields stand beside op instead of in body).
	V int `json:"v,omitempty"`
	// Ignorable lets a server that does not know Op (or V) skip the
	// command; without it such a server halts.
	Ignorable bool            `json:"ignorable,omitempty"`
	At        time.Time       `json:"at"`
	Body      json.RawMessage `json:"body,omitempty"`
}

// Encode writes c as the log holds it, stamped at (the leader's clock).
func Encode(c Command, at time.Time) ([]byte, error) {
	d, ok := types[c.CommandType()]
	if !ok {
		return nil, structs.Errf(structs.CodeInternal, "command type %q is not registered", c.CommandType())
	}
	body, err := json.Marshal(c)
	if err != nil {
		return nil, structs.Wrap(structs.CodeInternal, err, "encode command %s", c.CommandType())
	}
	return json.Marshal(Envelope{Op: c.CommandType(), V: d.version, Ignorable: d.ignorable, At: at.UTC(), Body: body})
}

// UnknownCommandError is a committed command this server cannot read: a
// type it does not know, or a newer version of one it does.
type UnknownCommandError struct {
	Op Type
	// Version is the command's; Known the newest this server reads (0:
	// the type is unknown).
	Version, Known int
	// Index is the entry's index in the log (0 when not known).
	Index uint64
}

func (e *UnknownCommandError) Error() string {
	if e.Known == 0 {
		return fmt.Sprintf("the replicated log holds a command of type %q (entry %d), which this server does not know: a newer CapyCTL wrote it; upgrade this server",
			e.Op, e.Index)
	}
	return fmt.Sprintf("the replicated log holds version %d of command %q (entry %d); this server reads up to version %d: a newer CapyCTL wrote it; upgrade this server",
		e.Version, e.Op, e.Index, e.Known)
}

// Decode reads one log entry: its envelope and typed command. A type or
// version this server does not know returns the envelope and an
// *UnknownCommandError (the caller reads Envelope.Ignorable).
func Decode(data []byte) (Envelope, Command, error) {
	var env Envelope
	if err := json.Unmarshal(data, &env); err != nil {
		return env, nil, fmt.Errorf("a server command does not decode: %w", err)
	}
	d, ok := types[env.Op]
	if !ok || env.V > d.version {
		return env, nil, &UnknownCommandError{Op: env.Op, Version: env.V, Known: d.version}
	}
	body := []byte(env.Body)
	if env.V == 0 || len(bytes.TrimSpace(body)) == 0 {
		// A first release's record: its fields are the body's, beside op.
		body = data
	}
	c, err := d.decode(body)
	if err != nil {
		return env, nil, fmt.Errorf("the body of command %s does not decode: %w", env.Op, err)
	}
	return env, c, nil
}
