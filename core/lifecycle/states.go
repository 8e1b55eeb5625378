// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package lifecycle

import (
	"fmt"

	"github.com/capyctl/capyctl/core/structs"
)

// transitions is the instance state machine as data. IMPORTANT: every state
// change goes through checkTransition; a change this table does not list is
// a bug, never a shortcut.
//
//	stopped -> starting -> ready -> draining -> parking -> parked -> waking -> ready
//	draining -> stopping -> stopped;  parked -> stopping;  ready -> stopping
//	parked -> starting (restart_only parked with its LMCache server: a new
//	engine launch reconnects to it)
//	any (but reconciling) -> reconciling -> stopped | ready | failed | stopping
//	any live state -> failed (with the reason); failed -> starting (an
//	operator start or a new request tries again) | stopping | stopped
var transitions = map[structs.InstanceState][]structs.InstanceState{
	structs.StateStopped:     {structs.StateStarting, structs.StateReconciling},
	structs.StateStarting:    {structs.StateReady, structs.StateStopping, structs.StateStopped, structs.StateFailed, structs.StateReconciling},
	structs.StateReady:       {structs.StateDraining, structs.StateStopping, structs.StateStopped, structs.StateFailed, structs.StateReconciling},
	structs.StateDraining:    {structs.StateParking, structs.StateStopping, structs.StateReady, structs.StateFailed, structs.StateReconciling},
	structs.StateParking:     {structs.StateParked, structs.StateReady, structs.StateStopping, structs.StateFailed, structs.StateReconciling},
	structs.StateParked:      {structs.StateWaking, structs.StateStarting, structs.StateStopping, structs.StateStopped, structs.StateFailed, structs.StateReconciling},
	structs.StateWaking:      {structs.StateReady, structs.StateStopping, structs.StateFailed, structs.StateReconciling},
	structs.StateStopping:    {structs.StateStopped, structs.StateFailed, structs.StateReconciling},
	structs.StateFailed:      {structs.StateStarting, structs.StateStopping, structs.StateStopped, structs.StateReconciling},
	structs.StateReconciling: {structs.StateStopped, structs.StateReady, structs.StateParked, structs.StateFailed, structs.StateStopping},
}

// CanTransition reports whether from -> to is legal.
func CanTransition(from, to structs.InstanceState) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// checkTransition returns an error for an illegal change.
func checkTransition(from, to structs.InstanceState) error {
	if !CanTransition(from, to) {
		return structs.Errf(structs.CodeConflict, "illegal instance transition %s -> %s", from, to)
	}
	return nil
}

// States lists every state in lifecycle order.
func States() []structs.InstanceState {
	return []structs.InstanceState{
		structs.StateStopped, structs.StateStarting, structs.StateReady, structs.StateDraining,
		structs.StateParking, structs.StateParked, structs.StateWaking, structs.StateStopping,
		structs.StateFailed, structs.StateReconciling,
	}
}

// holdsProcesses reports whether an instance in state s may have engine
// processes that must be proven gone before its memory is released.
func holdsProcesses(s structs.InstanceState) bool {
	switch s {
	case structs.StateStopped:
		return false
	case structs.StateFailed:
		return false
	}
	return true
}

// describe renders a transition for the instance's last_transition field.
func describe(from, to structs.InstanceState, why string) string {
	if why == "" {
		return fmt.Sprintf("%s -> %s", from, to)
	}
	return fmt.Sprintf("%s -> %s: %s", from, to, why)
}
