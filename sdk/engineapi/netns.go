// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package engineapi

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/capyctl/capyctl/sdk/proc"
)

// NetnsScheme starts the base URL of an engine that listens on 127.0.0.1
// in a network namespace of its own (an engine with no Unix-socket option,
// launched by a role that runs as root): "http+netns://" followed by
// NetnsHost. Only a process that may enter the namespace (root) reaches
// the engine, through DialNetns.
const NetnsScheme = "http+netns://"

// netnsDomain ends the host name of a namespaced engine: ".invalid" is
// reserved (RFC 2606), so no real host is ever taken for one.
const netnsDomain = ".netns.invalid"

// NetnsAddr is where a namespaced engine listens: 127.0.0.1:Port in the
// network namespace of the process Engine names.
type NetnsAddr struct {
	Engine proc.Identity
	Port   int
}

// NetnsHost is the host:port form of a: "<pid>.<start ticks>.netns.invalid:<port>",
// a valid Host header and a connection pool's key.
func NetnsHost(a NetnsAddr) string {
	return strconv.Itoa(a.Engine.PID) + "." + strconv.FormatUint(a.Engine.StartTicks, 10) + netnsDomain + ":" + strconv.Itoa(a.Port)
}

// NetnsBaseURL is the base URL of a namespaced engine.
func NetnsBaseURL(a NetnsAddr) string { return NetnsScheme + NetnsHost(a) }

// ParseNetnsHost decodes a host made by NetnsHost; false for any other
// (a plain host:port, a Unix socket's escaped path).
func ParseNetnsHost(host string) (NetnsAddr, bool) {
	name, port, ok := strings.Cut(host, ":")
	if !ok {
		return NetnsAddr{}, false
	}
	name, ok = strings.CutSuffix(name, netnsDomain)
	if !ok {
		return NetnsAddr{}, false
	}
	pid, ticks, ok := strings.Cut(name, ".")
	if !ok {
		return NetnsAddr{}, false
	}
	var a NetnsAddr
	var err1, err2, err3 error
	a.Engine.PID, err1 = strconv.Atoi(pid)
	a.Engine.StartTicks, err2 = strconv.ParseUint(ticks, 10, 64)
	a.Port, err3 = strconv.Atoi(port)
	if err1 != nil || err2 != nil || err3 != nil || a.Engine.PID <= 1 || a.Port <= 0 || a.Port > 65535 {
		return NetnsAddr{}, false
	}
	return a, true
}

// NetnsFromURL returns the address of a base URL made by NetnsBaseURL, and
// false for any other URL.
func NetnsFromURL(baseURL string) (NetnsAddr, bool) {
	rest, ok := strings.CutPrefix(baseURL, NetnsScheme)
	if !ok {
		return NetnsAddr{}, false
	}
	host, _, _ := strings.Cut(rest, "/")
	return ParseNetnsHost(host)
}

// DialNetns connects to a namespaced engine (proc.DialNetns: the engine's
// identity is checked first, and a namespace that is the caller's own is
// refused).
func DialNetns(ctx context.Context, a NetnsAddr) (net.Conn, error) {
	c, err := proc.DialNetns(ctx, a.Engine, a.Port)
	if err != nil {
		return nil, fmt.Errorf("dial engine %s: %w", NetnsHost(a), err)
	}
	return c, nil
}
