// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package sdk is what a CapyCTL driver author imports: the Driver interface
// and its request and response types, the error type that carries a catalogue code across the wire, and helpers
// in its sub-packages (plugin, flags, engineapi, proc, formats). It never
// imports anything from CapyCTL's core or its first-party drivers.
package sdk

import (
	"context"
	"errors"
	"fmt"
)

// ProtocolVersion is the driver protocol this SDK speaks.
const ProtocolVersion = 1

// Driver is what a driver implements: the driver protocol in Go types.
// Each method is the RPC of the same name in
// sdk/proto/driverv1/driver.proto, whose comments are the contract, and
// each request and response type is the message of the same name
// (messages.go). A driver never sees the generated protobuf types:
// sdk/plugin converts at the gRPC boundary, on the driver's side
// (plugin.Serve) and on the core's (plugin.Client). A driver that does not
// support a call returns ErrNotSupported (embed UnimplementedDriver to get
// that for every call); an error with a catalogue code is an *Error
// (Errorf), and its code survives the hop.
type Driver interface {
	Describe(ctx context.Context, req *DescribeRequest) (*DescribeResponse, error)
	Detect(ctx context.Context, req *DetectRequest) (*DetectResponse, error)
	Flags(ctx context.Context, req *FlagsRequest) (*FlagsResponse, error)
	Plan(ctx context.Context, req *PlanRequest) (*PlanResponse, error)
	Start(ctx context.Context, req *StartRequest) (*StartResponse, error)
	Probe(ctx context.Context, req *ProbeRequest) (*ProbeResponse, error)
	Park(ctx context.Context, req *ParkRequest) (*ParkResponse, error)
	Wake(ctx context.Context, req *WakeRequest) (*WakeResponse, error)
	Abort(ctx context.Context, req *AbortRequest) (*AbortResponse, error)
	Load(ctx context.Context, req *LoadRequest) (*LoadResponse, error)
	Stop(ctx context.Context, req *StopRequest) (*StopResponse, error)
	Recover(ctx context.Context, req *RecoverRequest) (*RecoverResponse, error)
	Logs(ctx context.Context, req *LogsRequest) (*LogsResponse, error)
}

// ExitWaiter is what a driver implements to report an engine's exit the
// moment it happens (the WaitExit RPC): WaitExit blocks until the
// instance's engine process is gone, then says how it ended (Exited true,
// the exit code, the last log lines), or returns ctx's error when the core
// stops watching. enginekit.Instance.WaitExit does the waiting. A driver
// without it keeps working: the core polls LIVENESS instead.
type ExitWaiter interface {
	WaitExit(ctx context.Context, req *WaitExitRequest) (*ExitEvent, error)
}

// ErrNotSupported is returned for a call the driver does not implement. Over
// gRPC it travels as codes.Unimplemented and comes back as ErrNotSupported.
var ErrNotSupported = errors.New("not supported by this driver")

// Error is a driver failure with a stable code from CapyCTL's catalogue
// (for example "launch_failed", "instance_not_found", "park_failed"). The
// code survives the gRPC hop; the core maps it to its HTTP status and exit
// code.
type Error struct {
	Code    string
	Message string
}

// Error implements error.
func (e *Error) Error() string {
	if e.Message == "" {
		return e.Code
	}
	return e.Message
}

// Errorf builds an *Error with a code and a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// CodeOf returns the catalogue code carried by err, or "" when it has none.
func CodeOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// Common codes drivers return.
const (
	CodeInstanceNotFound = "instance_not_found"
	CodeLaunchFailed     = "launch_failed"
	CodeStartupTimeout   = "startup_timeout"
	CodeOffLoopback      = "engine_listens_off_loopback"
	CodeParkFailed       = "park_failed"
	CodeWakeFailed       = "wake_failed"
	CodeStopFailed       = "stop_failed"
	CodeNotIdle          = "engine_not_idle"
	CodeInvalidManifest  = "invalid_manifest"
	CodeEngineNotFound   = "engine_not_found"
	CodeToolchainMissing = "toolchain_missing"
	// CodeDriverUnavailable: the driver process could not be reached (it
	// died or is restarting); set by the client side, never by a driver.
	CodeDriverUnavailable = "driver_unavailable"
	// CodeDriverTimeout: the driver did not answer within the core's
	// deadline for the call; set by the client side, never by a driver.
	CodeDriverTimeout = "driver_timeout"
)

// UnimplementedDriver answers ErrNotSupported for every call. Embed it to
// implement only part of the protocol.
type UnimplementedDriver struct{}

var _ Driver = UnimplementedDriver{}

func (UnimplementedDriver) Describe(context.Context, *DescribeRequest) (*DescribeResponse, error) {
	return nil, ErrNotSupported
}
func (UnimplementedDriver) Detect(context.Context, *DetectRequest) (*DetectResponse, error) {
	return nil, ErrNotSupported
}
func (UnimplementedDriver) Flags(context.Context, *FlagsRequest) (*FlagsResponse, error) {
	return nil, ErrNotSupported
}
func (UnimplementedDriver) Plan(context.Context, *PlanRequest) (*PlanResponse, error) {
	return nil, ErrNotSupported
}
func (UnimplementedDriver) Start(context.Context, *StartRequest) (*StartResponse, error) {
	return nil, ErrNotSupported
}
func (UnimplementedDriver) Probe(context.Context, *ProbeRequest) (*ProbeResponse, error) {
	return nil, ErrNotSupported
}
func (UnimplementedDriver) Park(context.Context, *ParkRequest) (*ParkResponse, error) {
	return nil, ErrNotSupported
}
func (UnimplementedDriver) Wake(context.Context, *WakeRequest) (*WakeResponse, error) {
	return nil, ErrNotSupported
}
func (UnimplementedDriver) Abort(context.Context, *AbortRequest) (*AbortResponse, error) {
	return nil, ErrNotSupported
}
func (UnimplementedDriver) Load(context.Context, *LoadRequest) (*LoadResponse, error) {
	return nil, ErrNotSupported
}
func (UnimplementedDriver) Stop(context.Context, *StopRequest) (*StopResponse, error) {
	return nil, ErrNotSupported
}
func (UnimplementedDriver) Recover(context.Context, *RecoverRequest) (*RecoverResponse, error) {
	return nil, ErrNotSupported
}
func (UnimplementedDriver) Logs(context.Context, *LogsRequest) (*LogsResponse, error) {
	return nil, ErrNotSupported
}
