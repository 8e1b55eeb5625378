// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package engineapi

import (
	"errors"
	"net/url"
	"strings"
)

// UnixScheme starts the base URL of an engine that listens on a Unix
// socket instead of a loopback port: "http+unix://" followed by the
// socket's path, query-escaped so that it is one valid Host header
// ("%2Fstate%2Flaunches%2Fchat%2F0-L1%2Fengine.sock"), the convention of
// requests-unixsocket. Nothing else names the socket: the router, the
// drivers and the conformance suite all read it from the base URL.
const UnixScheme = "http+unix://"

// UnixHost is the Host header a request to a Unix-socket engine carries
// when the client has no better name (net/http needs a host in its URL).
const UnixHost = "localhost"

// UnixBaseURL is the base URL of an engine listening on the Unix socket at
// path (an absolute path).
func UnixBaseURL(path string) string { return UnixScheme + url.QueryEscape(path) }

// UnixSocket returns the socket path of a base URL made by UnixBaseURL, and
// false for any other URL.
func UnixSocket(baseURL string) (string, bool) {
	rest, ok := strings.CutPrefix(baseURL, UnixScheme)
	if !ok {
		return "", false
	}
	host, _, _ := strings.Cut(rest, "/")
	p, err := UnixSocketFromHost(host)
	if err != nil {
		return "", false
	}
	return p, true
}

// UnixSocketFromHost decodes the host part of a Unix base URL (the
// escaped socket path) back into the path.
func UnixSocketFromHost(host string) (string, error) {
	p, err := url.QueryUnescape(host)
	if err != nil {
		return "", err
	}
	if !strings.HasPrefix(p, "/") {
		return "", errors.New("unix socket path must be absolute: " + p)
	}
	return p, nil
}
