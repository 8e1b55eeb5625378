// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"fmt"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/grpclog"
)

// grpcLogOnce guards grpclog.SetLoggerV2, which is process-wide and must
// be set before gRPC runs.
var grpcLogOnce sync.Once

// routeGRPCLogs sends gRPC's own log (the host link's and the drivers'
// transport warnings and errors) into the role's logger, so that a host's
// log stays one JSON object per line: gRPC's default writes plain text to
// stderr. Its info lines go at debug. The first role of a process sets it
// (dev runs one role in its process).
func routeGRPCLogs(l hclog.Logger) {
	grpcLogOnce.Do(func() { grpclog.SetLoggerV2(grpcLogger{l.Named("grpc")}) })
}

// grpcLogger is grpclog.LoggerV2 over hclog.
type grpcLogger struct{ l hclog.Logger }

func (g grpcLogger) Info(args ...any)                    { g.l.Debug(fmt.Sprint(args...)) }
func (g grpcLogger) Infoln(args ...any)                  { g.l.Debug(sprintln(args...)) }
func (g grpcLogger) Infof(format string, args ...any)    { g.l.Debug(fmt.Sprintf(format, args...)) }
func (g grpcLogger) Warning(args ...any)                 { g.l.Warn(fmt.Sprint(args...)) }
func (g grpcLogger) Warningln(args ...any)               { g.l.Warn(sprintln(args...)) }
func (g grpcLogger) Warningf(format string, args ...any) { g.l.Warn(fmt.Sprintf(format, args...)) }
func (g grpcLogger) Error(args ...any)                   { g.l.Error(fmt.Sprint(args...)) }
func (g grpcLogger) Errorln(args ...any)                 { g.l.Error(sprintln(args...)) }
func (g grpcLogger) Errorf(format string, args ...any)   { g.l.Error(fmt.Sprintf(format, args...)) }

// Fatal logs at error; grpclog exits the process after it.
func (g grpcLogger) Fatal(args ...any)                 { g.l.Error(fmt.Sprint(args...)) }
func (g grpcLogger) Fatalln(args ...any)               { g.l.Error(sprintln(args...)) }
func (g grpcLogger) Fatalf(format string, args ...any) { g.l.Error(fmt.Sprintf(format, args...)) }

// V reports whether gRPC's verbose level l is logged: none of them (its
// verbose lines are debugging aids for gRPC itself).
func (g grpcLogger) V(l int) bool { return false }

// sprintln is fmt.Sprintln without its newline (the *ln methods put spaces
// between every operand).
func sprintln(args ...any) string { return strings.TrimSuffix(fmt.Sprintln(args...), "\n") }
