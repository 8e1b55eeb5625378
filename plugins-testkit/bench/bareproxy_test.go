// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"testing"
)

// bareProxyEnv turns this package's test binary into a bare reverse proxy
// (net/http/httputil.ReverseProxy, nothing else) in front of the URL it
// names: the floor for any Go proxy run as a process of its own, measured
// in the same run as the role (reference/proxy-lessons.md, "bare proxy").
const bareProxyEnv = "CAPYCTL_BENCH_BARE_PROXY"

func TestMain(m *testing.M) {
	if target := os.Getenv(bareProxyEnv); target != "" {
		if err := serveBareProxy(target); err != nil {
			fmt.Fprintln(os.Stderr, "bare proxy:", err)
			os.Exit(1)
		}
		return
	}
	os.Exit(m.Run())
}

// serveBareProxy listens on a loopback port, prints its address on the
// first line of stdout and proxies every request to target. It reads the
// request body into memory first: the stock ReverseProxy otherwise closes
// the engine connection when the answer arrives before its own last read
// of the body (Go issue 40747), and a proxy must read the body anyway to
// find the model.
func serveBareProxy(target string) error {
	u, err := url.Parse(target)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}
	rp.FlushInterval = -1                    // relay streamed answers chunk by chunk, as the router does
	rp.ErrorLog = log.New(io.Discard, "", 0) // its errors are counted by the client
	fmt.Println(ln.Addr().String())
	return http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		rp.ServeHTTP(w, r)
	}))
}

// startBareProxy runs a bare proxy in front of target until the benchmark
// ends and returns its base URL.
func startBareProxy(b testing.TB, target string) string {
	b.Helper()
	url, _ := startBareProxyPID(b, target)
	return url
}
