// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"context"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk"
)

// Placer reserves memory for instances (the ledger and GPU inventory
// implement it). The lifecycle calls Reserve before a launch, Phase as the
// instance moves between ledger phases, and Release once its processes are
// proven gone.
type Placer interface {
	// Reserve admits an instance's startup phase, or refuses it
	// (capacity_blocked with the figures).
	Reserve(ctx context.Context, req Reservation) (*Grant, error)
	// Phase moves an owner to the charge of a phase ("ready", "parked").
	Phase(owner string, phase string) error
	// Release drops every charge of an owner.
	Release(owner string)
}

// PhaseRecorder is implemented by placers whose phase change can be split:
// PhaseThen changes the charge at once, in memory, and leaves what it
// writes (its charge record, a measurement) to record (never nil), which
// the lifecycle runs on the instance's lane once the instance serves. A
// restart before record ran finds the charge record in the phase before;
// recovery adopts the instance in the phase it is in (Adopt).
type PhaseRecorder interface {
	PhaseThen(owner string, phase string) (record func(), err error)
}

// ChargeRecorder is implemented by placers whose charge record can be
// written with the launch record, in one synced write before the launch
// instead of two: ReserveUnrecorded charges the ledger as Reserve does
// (at once, in memory: the next placement counts it) but writes nothing;
// WithCharge calls put with the store meta values of the owner's charge
// record as it is then (none for an owner released meanwhile), under the
// placer's lock, and put writes them in the launch record's transaction.
// IMPORTANT: a crash before that write leaves neither the launch nor its
// charge recorded, and no engine was started: nothing is lost and nothing
// is charged twice; after it, both are, as with two writes.
type ChargeRecorder interface {
	ReserveUnrecorded(ctx context.Context, req Reservation) (*Grant, error)
	WithCharge(owner string, put func(meta map[string]string) error) error
}

// chargeWrite wraps a record's write so that it carries a charge record
// (ChargeRecorder.WithCharge, bound to its owner).
type chargeWrite func(put func(meta map[string]string) error) error

// ProcessObserver is implemented by placers that measure a start from the
// engine's own processes (the startup peak, SPEC D2): the lifecycle calls
// Launched once the driver reports the launch's process group and
// identities; the measurement ends with Phase(owner, "ready") (stored) or
// Release (discarded).
type ProcessObserver interface {
	Launched(owner string, pgid int, procs []structs.ProcessIdentity)
}

// Reservation is what a start asks of the placer.
type Reservation struct {
	Owner      string
	Deployment *structs.Deployment
	Revision   uint64
	Engine     *structs.EngineRecord
	Hints      *sdk.MemoryHints
	Residency  string
}

// Grant is what the placer decided for a launch.
type Grant struct {
	DeviceUUIDs []string
	DeviceBytes int64
	DeviceTotal int64
	KVBytes     int64
	// Env is added to the engine's environment (CUDA_VISIBLE_DEVICES).
	Env map[string]string
}

// noPlacer admits everything (no ledger configured).
type noPlacer struct{}

func (noPlacer) Reserve(context.Context, Reservation) (*Grant, error) { return &Grant{}, nil }
func (noPlacer) Phase(string, string) error                           { return nil }
func (noPlacer) Release(string)                                       {}
