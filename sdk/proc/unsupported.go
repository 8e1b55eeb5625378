// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build !linux

package proc

import (
	"context"
	"net"
	"net/netip"
	"time"
)

// MaybeRunShim returns at once: there is no shim outside Linux.
func MaybeRunShim() {}

// CloseSpares does nothing outside Linux (no shim, no spare).
func CloseSpares(time.Duration) {}

// Start returns ErrUnsupported outside Linux.
func Start(LaunchSpec) (*Launched, error) { return nil, ErrUnsupported }

// Alive returns false outside Linux.
func Alive(Identity) bool { return false }

// ReadStartTicks returns ErrUnsupported outside Linux.
func ReadStartTicks(int) (uint64, error) { return 0, ErrUnsupported }

// GroupPIDs returns nil outside Linux.
func GroupPIDs(int) []int { return nil }

// Descendants returns nil outside Linux.
func Descendants(int) []int { return nil }

// ProcessName returns "" outside Linux.
func ProcessName(int) string { return "" }

// TreeMemory returns ErrUnsupported outside Linux.
func TreeMemory(int) (int64, int64, error) { return 0, 0, ErrUnsupported }

// Stop returns ErrUnsupported outside Linux.
func Stop(Launched, time.Duration) (StopResult, error) {
	return StopResult{ExitCode: -1}, ErrUnsupported
}

// ReadStatus returns ErrUnsupported outside Linux.
func ReadStatus(string) (Status, error) { return Status{ExitCode: -1}, ErrUnsupported }

// WaitExitStatus returns ErrUnsupported outside Linux.
func WaitExitStatus(string, time.Duration) (Status, error) {
	return Status{ExitCode: -1}, ErrUnsupported
}

// Tail returns ErrUnsupported outside Linux.
func Tail(string, int) (string, bool, error) { return "", false, ErrUnsupported }

// LastLines returns nil outside Linux.
func LastLines(string, int) []string { return nil }

// Release returns ErrUnsupported outside Linux.
func Release(string) error { return ErrUnsupported }

// ListeningAddrs returns ErrUnsupported outside Linux.
func ListeningAddrs(int) ([]netip.AddrPort, error) { return nil, ErrUnsupported }

// AskShortSlice does nothing outside Linux.
func AskShortSlice() error { return nil }

// Group is a process group's members; nothing outside Linux.
type Group struct{}

// NewGroup returns an empty Group outside Linux.
func NewGroup(int) *Group { return &Group{} }

// PIDs returns nil outside Linux.
func (*Group) PIDs() []int { return nil }

// ListeningAddrs returns ErrUnsupported outside Linux.
func (*Group) ListeningAddrs() ([]netip.AddrPort, error) { return nil, ErrUnsupported }

// Inspect reports LaunchUncertain outside Linux.
func Inspect(Launched) (LaunchState, string) { return LaunchUncertain, ErrUnsupported.Error() }

// DisableCoreDumps does nothing outside Linux.
func DisableCoreDumps() error { return nil }

// Dumpable reports true outside Linux (there is no such flag).
func Dumpable() (bool, error) { return true, nil }

// OwnNetns returns ErrUnsupported outside Linux.
func OwnNetns(Identity) (bool, error) { return false, ErrUnsupported }

// DialNetns returns ErrUnsupported outside Linux.
func DialNetns(context.Context, Identity, int) (net.Conn, error) { return nil, ErrUnsupported }

// NetnsSupported returns false outside Linux.
func NetnsSupported() bool { return false }

// CoreFileLimit returns ErrUnsupported outside Linux.
func CoreFileLimit(int) (string, string, error) { return "", "", ErrUnsupported }

// WaitGone returns ErrUnsupported outside Linux.
func WaitGone(context.Context, Identity) error { return ErrUnsupported }
