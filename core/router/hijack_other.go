// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build !unix

package router

// hijackSupported: without a way to notice a hang-up outside net/http,
// every answer stays on net/http.
const hijackSupported = false

// watch is never started where streams are not taken over.
func (c *clientConn) watch() {}
