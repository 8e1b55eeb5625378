// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package plugin carries the driver protocol over hashicorp/go-plugin: the
// handshake, the versioned plugin sets, Serve for a driver's main function,
// the gRPC client the core uses, and the conversion between the SDK's Go
// types and the generated protobuf messages. IMPORTANT: it is the only
// package that imports the generated package (sdk/proto/driverv1); drivers
// and the core see Go types only (core/imports_test.go keeps it so).
package plugin

import (
	"context"
	"errors"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/proc"
	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
)

// PluginName is the single plugin every driver binary dispenses.
const PluginName = "driver"

// Handshake is shared by the core and every driver. The magic cookie only
// keeps a driver binary from being run by hand by mistake; it is not a
// security measure.
var Handshake = goplugin.HandshakeConfig{
	ProtocolVersion:  sdk.ProtocolVersion,
	MagicCookieKey:   "CAPYCTL_DRIVER_PLUGIN",
	MagicCookieValue: "3f0c5a1e-capyctl-driver-protocol",
}

// EnvDriverLogFile names a file a served driver appends its JSON log to, in
// addition to stderr: after the core restarts and re-attaches, stderr no
// longer reaches anyone.
const EnvDriverLogFile = "CAPYCTL_DRIVER_LOG_FILE"

// EnvDriverLogLevel sets the served driver's log level (default info).
const EnvDriverLogLevel = "CAPYCTL_DRIVER_LOG_LEVEL"

// VersionedPlugins returns the plugin sets by protocol version. Protocol 1
// is the only one today; a future protocol 2 is served beside it.
func VersionedPlugins(d sdk.Driver) map[int]goplugin.PluginSet {
	return map[int]goplugin.PluginSet{
		1: {PluginName: &GRPCDriverPlugin{Impl: d}},
	}
}

// GRPCDriverPlugin adapts a Driver to go-plugin's gRPC plugin interface.
type GRPCDriverPlugin struct {
	goplugin.NetRPCUnsupportedPlugin
	// Impl is the driver; nil on the client side.
	Impl sdk.Driver
}

// GRPCServer registers the driver service.
func (p *GRPCDriverPlugin) GRPCServer(_ *goplugin.GRPCBroker, s *grpc.Server) error {
	pb.RegisterDriverServer(s, &server{impl: p.Impl})
	return nil
}

// GRPCClient returns a *Client, which implements sdk.Driver.
func (p *GRPCDriverPlugin) GRPCClient(_ context.Context, _ *goplugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return NewClient(c), nil
}

// Serve runs a driver until the core kills it. It logs JSON through hclog to
// stderr (and to $CAPYCTL_DRIVER_LOG_FILE when set) and serves gRPC only.
// Call it from a driver binary's main. It never returns normally.
func Serve(d sdk.Driver) {
	// A driver's engines run behind a launch supervisor that is this binary
	// re-executed (sdk/proc); it takes over before go-plugin does.
	proc.MaybeRunShim()
	// A driver sleeps until a start needs it: quick to wake on a busy
	// machine (its shims inherit this; their engines do not). An older
	// kernel keeps its own slice.
	_ = proc.AskShortSlice()
	// IMPORTANT: a driver outlives the core that launched it (the core
	// re-attaches after a restart). Once that core is gone, writes to the
	// stderr pipe fail; with SIGPIPE ignored they fail quietly instead of
	// killing the driver and stranding its engines.
	signal.Ignore(syscall.SIGPIPE)
	// IMPORTANT: a driver holds every key of its engines; no core file
	// and no ptrace/proc access for other users (the shim, above, is a
	// fresh exec and sets its engine's limit itself).
	logger := NewLogger("driver")
	if err := proc.DisableCoreDumps(); err != nil {
		logger.Warn("could not disable core dumps", "error", err)
	}

	goplugin.Serve(&goplugin.ServeConfig{
		HandshakeConfig:  Handshake,
		VersionedPlugins: VersionedPlugins(d),
		GRPCServer:       goplugin.DefaultGRPCServer,
		Logger:           logger,
	})
	// The core ended the driver gracefully: its spare launch supervisor
	// goes before it does.
	proc.CloseSpares(2 * time.Second)
}

// NewLogger returns the JSON logger a served driver uses.
func NewLogger(name string) hclog.Logger {
	var out io.Writer = quietWriter{os.Stderr}
	if path := os.Getenv(EnvDriverLogFile); path != "" {
		if f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); err == nil {
			out = io.MultiWriter(out, quietWriter{f})
		}
	}
	level := hclog.LevelFromString(os.Getenv(EnvDriverLogLevel))
	if level == hclog.NoLevel {
		level = hclog.Info
	}
	return hclog.New(&hclog.LoggerOptions{
		Name:       name,
		Level:      level,
		Output:     out,
		JSONFormat: true,
	})
}

// quietWriter never reports an error, so one dead sink does not stop the
// others in a MultiWriter.
type quietWriter struct{ w io.Writer }

func (q quietWriter) Write(p []byte) (int, error) {
	_, _ = q.w.Write(p)
	return len(p), nil
}

// IsNotSupported reports whether err means the driver lacks the call.
func IsNotSupported(err error) bool { return errors.Is(err, sdk.ErrNotSupported) }
