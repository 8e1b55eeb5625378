// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pluginmgr

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"sync"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/sdk"
	sdkplugin "github.com/capyctl/capyctl/sdk/plugin"
)

// The faults of a driver, as its author reads them: each error names the
// driver (its family and program), the step or call that failed, and what
// to do, under a code of the catalogue. go-plugin reports them as bare
// strings; these are the ones it has in v1.8.0 (client.go).
const (
	goPluginExited = "plugin exited before we could connect"
	// goPluginNoLine: the driver closed its stdout (it exited) without
	// writing the handshake line.
	goPluginNoLine       = "Failed to read any lines from plugin's stdout"
	goPluginUnrecognized = "Unrecognized remote plugin message"
	goPluginIncompatible = "incompatible API version with plugin"
	goPluginCore         = "incompatible core API version with plugin"
	goPluginProtocol     = "unsupported plugin protocol"
	// grpcUnmarshal is gRPC's message for a reply that does not decode.
	grpcUnmarshal = "failed to unmarshal"
)

// pluginVersionRE finds the protocol a driver announced in go-plugin's
// incompatibility message ("Plugin version: 7, Client versions: [1]").
var pluginVersionRE = regexp.MustCompile(`Plugin version: (\d+)`)

// stderrTail keeps the last bytes a driver wrote to stderr while it
// launched, for the error of a driver that died then.
type stderrTail struct {
	mu  sync.Mutex
	buf []byte
}

// stderrTailBytes bounds what a launch error quotes.
const stderrTailBytes = 2 << 10

func (s *stderrTail) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf = append(s.buf, p...)
	if len(s.buf) > stderrTailBytes {
		s.buf = s.buf[len(s.buf)-stderrTailBytes:]
	}
	return len(p), nil
}

func (s *stderrTail) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.TrimSpace(string(bytes.ToValidUTF8(s.buf, nil)))
}

// driverName names a driver in an error: the family, and the program of a
// third-party one.
func (d *driverProc) name() string {
	if len(d.args) > 0 { // built in: `capyctl driver <family>`
		return fmt.Sprintf("driver %q (built in)", d.family)
	}
	return fmt.Sprintf("driver %q (%s)", d.family, d.program)
}

// launchFault turns the error of a launch that failed into the fault an
// author can act on; other errors stay driver_unavailable.
func launchFault(d *driverProc, err error, stderr string) error {
	msg := err.Error()
	tail := ""
	if stderr != "" {
		tail = "; its stderr ended with:\n" + stderr
	}
	switch {
	case strings.Contains(msg, goPluginExited), strings.Contains(msg, goPluginNoLine):
		return fault(structs.CodeDriverExitedAtStart, err,
			"%s exited at launch, before the plugin handshake: run it by hand to see why (it must start without arguments and call sdk/plugin.Serve)%s",
			d.name(), tail)
	case strings.Contains(msg, goPluginIncompatible):
		announced := "another protocol"
		if m := pluginVersionRE.FindStringSubmatch(msg); m != nil {
			announced = "protocol " + m[1]
		}
		return fault(structs.CodeDriverProtocolUnsupported, err,
			"%s speaks driver %s, and this CapyCTL speaks %s: rebuild the driver against an SDK that serves a protocol this CapyCTL speaks (sdk.ProtocolVersion), or upgrade CapyCTL",
			d.name(), announced, protocolList())
	case strings.Contains(msg, goPluginUnrecognized), strings.Contains(msg, goPluginCore), strings.Contains(msg, goPluginProtocol):
		first := strings.TrimSpace(strings.TrimPrefix(strings.SplitN(msg, "\n", 2)[0], goPluginUnrecognized+":"))
		return fault(structs.CodeDriverHandshakeFailed, err,
			"%s failed the plugin handshake at launch (its first line on stdout: %q): a driver's main must call sdk/plugin.Serve, and write nothing else to stdout (log to stderr)%s",
			d.name(), first, tail)
	}
	if errors.Is(err, sdk.ErrNotSupported) {
		return malformed(d, "Describe", err, "Describe is not implemented, and every driver must answer it")
	}
	if f := replyFault(d, "Describe", err); f != nil {
		return f
	}
	var coded *structs.Error
	if errors.As(err, &coded) && coded.Code == structs.CodeDriverReplyMalformed {
		return err
	}
	return structs.Wrap(structs.CodeDriverUnavailable, err, "launch %s", d.name())
}

// fault is a catalogue error whose message is the author's explanation
// alone: go-plugin's own text (a page on architectures and permissions)
// stays in the chain, and in the role's log, but not in what the operator
// reads.
func fault(code structs.Code, cause error, format string, args ...any) error {
	e := structs.Errf(code, format, args...)
	e.Cause = cause
	return e
}

// protocolList is the driver protocols this core speaks ("1", "1 and 2").
func protocolList() string {
	var vs []string
	for v := range sdkplugin.VersionedPlugins(nil) {
		vs = append(vs, fmt.Sprint(v))
	}
	return "protocol " + strings.Join(vs, " and ")
}

// replyFault is the fault of a call whose reply did not decode; nil for
// any other error.
func replyFault(d *driverProc, method string, err error) error {
	if err == nil || !strings.Contains(err.Error(), grpcUnmarshal) {
		return nil
	}
	return malformed(d, method, err, "the reply does not decode as the protocol's "+method+"Response")
}

// malformed is a driver_reply_malformed fault: which driver, which call,
// what is wrong and what to do.
func malformed(d *driverProc, method string, cause error, what string) error {
	return codedErr(structs.CodeDriverReplyMalformed, cause,
		"%s answered %s with a malformed reply: %s. This is a fault of the driver, not of the deployment: run the conformance suite (plugins-testkit/conformance) against it and fix the reply, or report it to the driver's author",
		d.name(), method, what)
}

// checkReply finds what a reply lacks that the protocol requires
// (sdk/proto/driverv1/driver.proto); "" when nothing. It checks what the
// core relies on, not what a driver may choose.
func checkReply(method string, negotiated int, resp any) string {
	if resp == nil || reflect.ValueOf(resp).IsNil() {
		return "an empty reply"
	}
	switch r := resp.(type) {
	case *sdk.DescribeResponse:
		switch {
		case r.Name == "":
			return "no name"
		case r.Protocol != 0 && negotiated != 0 && int(r.Protocol) != negotiated:
			return fmt.Sprintf("protocol %d, but the plugin handshake agreed on %d", r.Protocol, negotiated)
		}
	case *sdk.DetectResponse:
		if r.Family != "" && r.Digest == "" {
			return "no digest of the installation (Detect must pin what it found)"
		}
	case *sdk.PlanResponse:
		if len(r.Refusals) == 0 && (len(r.Argv) == 0 || r.Residency == "") {
			return "neither refusals nor a command and a residency"
		}
	case *sdk.StartResponse:
		if l := r.Launch; l.Pgid <= 0 || len(l.Processes) == 0 {
			return "no launch with its process group and processes (the core could not stop what runs)"
		}
	case *sdk.ProbeResponse:
		if r.Ready && r.Endpoint.BaseURL == "" {
			return "ready without an endpoint"
		}
	case *sdk.RecoverResponse:
		switch {
		case r.State == sdk.RecoverStateUnspecified:
			return "no state"
		case r.State == sdk.RecoverStateRunning && r.Endpoint.BaseURL == "":
			return "running without an endpoint"
		}
	}
	return ""
}
