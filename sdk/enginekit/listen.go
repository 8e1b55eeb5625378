// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package enginekit

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/engineapi"
	"github.com/capyctl/capyctl/sdk/proc"
)

// Listeners an Endpoint reports.
const (
	// ListenerUnix is a socket in the launch directory, which is 0700: only
	// the role's user reaches any of the engine's routes.
	ListenerUnix = "unix"
	// ListenerTCP is the leased loopback port: every local user can
	// connect, and the routes the engine does not guard with its key answer
	// them.
	ListenerTCP = "tcp"
	// ListenerNetns is the leased port on 127.0.0.1 in a network namespace
	// of the engine's own (a root role, an engine with no socket option):
	// only a process that may enter the namespace (root) reaches it.
	ListenerNetns = "netns"
)

// NetnsPossible reports whether this driver can launch an engine in a
// network namespace of its own: it runs as root and may make one
// (proc.NetnsSupported; elsewhere the engine stays on loopback and its
// exposure is reported).
func NetnsPossible() bool { return proc.NetnsSupported() }

// NetnsNote is the exposure note of a namespaced engine.
const NetnsNote = "network namespace of its own: only the role's user reaches it"

// SocketName is the engine's socket in its launch directory.
const SocketName = "engine.sock"

// maxSocketPath is the longest socket path an engine can bind: sun_path is
// 108 bytes with its NUL; engines bind the path they are given, so a
// longer one cannot be served (the driver then keeps the port).
const maxSocketPath = 100

// launchDirPlaceholder names the launch directory in a plan rendered
// before there is one.
const launchDirPlaceholder = "{{launch_dir}}"

// SocketPath is where an engine of the launch listens when it serves on a
// socket, and "" with the reason when it cannot: the launch directory's
// path leaves no room in sun_path.
func SocketPath(lctx *sdk.LaunchContext) (string, string) {
	if lctx == nil || lctx.LaunchDir == "" {
		return filepath.Join(launchDirPlaceholder, SocketName), ""
	}
	p := filepath.Join(lctx.LaunchDir, SocketName)
	if len(p) > maxSocketPath {
		return "", "the launch directory's path is too long for a Unix socket (" + strconv.Itoa(len(p)) + " bytes, at most " + strconv.Itoa(maxSocketPath) + ")"
	}
	return p, ""
}

// SocketOf returns the socket a launch's engine listens on when it served
// on one (re-attach: the record of the plan is gone, its socket is not),
// "" otherwise.
func SocketOf(launchDir string) string {
	if launchDir == "" {
		return ""
	}
	p := filepath.Join(launchDir, SocketName)
	st, err := os.Lstat(p)
	if err != nil || st.Mode()&os.ModeSocket == 0 {
		return ""
	}
	return p
}

// SocketInArgv returns the value of option in a rendered command line
// (--uds PATH, or --host PATH for llama-server), "" when absent.
func SocketInArgv(argv []string, option string) string {
	for i := 0; i+1 < len(argv); i++ {
		if argv[i] == option && strings.HasSuffix(argv[i+1], SocketName) {
			return argv[i+1]
		}
	}
	return ""
}

// Exposure is how a driver's engine listens and what it leaves open to
// other local users.
type Exposure struct {
	// Socket is the Unix socket the engine listens on; "" on TCP.
	Socket string
	// OpenRoutes answer any local user without the key on TCP ("*": all).
	OpenRoutes []string
	// Note says why the engine is on TCP.
	Note string
	// Netns, when its PID is set, is the engine process whose network
	// namespace of its own holds the listener (Socket is ""): no other
	// user reaches any route.
	Netns engineapi.NetnsAddr
}

// Apply points ep at the socket or the engine's network namespace (when
// there is one) and records the exposure on it.
func (x Exposure) Apply(ep *sdk.Endpoint) *sdk.Endpoint {
	if x.Socket != "" {
		ep.BaseURL = engineapi.UnixBaseURL(x.Socket)
		ep.Listener = ListenerUnix
		ep.OpenRoutes = nil
		ep.ExposureNote = ""
		return ep
	}
	if x.Netns.Engine.PID > 0 {
		ep.BaseURL = engineapi.NetnsBaseURL(x.Netns)
		ep.Listener = ListenerNetns
		ep.OpenRoutes = nil
		ep.ExposureNote = NetnsNote
		return ep
	}
	ep.Listener = ListenerTCP
	ep.OpenRoutes = x.OpenRoutes
	ep.ExposureNote = x.Note
	return ep
}

// OpenToAll is OpenRoutes of an engine launched without a key.
var OpenToAll = []string{"*"}
