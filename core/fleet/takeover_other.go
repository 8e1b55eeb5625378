// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build !unix

package fleet

import "net/http"

// takeOver is unix only: elsewhere a relayed stream stays on net/http.
func takeOver(http.ResponseWriter, *http.Request, *http.Response, func(), func()) bool { return false }
