// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"net/http"

	"github.com/gorilla/mux"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
)

// hostLedger answers GET /management/v1/hosts/{name}/ledger: the host's
// GPUs and its memory ledger (domains with capacity, managed limit, free
// reserve, memory held outside CapyCTL, charges and what is free; owners
// with their phase and charges).
func (b *Backend) hostLedger(w http.ResponseWriter, r *http.Request) {
	name := mux.Vars(r)["name"]
	if b.Hosts != nil {
		for _, h := range b.Hosts() {
			if h.Name == name {
				writeJSON(w, http.StatusOK, map[string]any{
					"api_version": wire.APIVersion, "host": h.Name, "gpus": h.GPUs, "ledger": h.Ledger,
				})
				return
			}
		}
	}
	writeMgmtError(w, structs.Errf(structs.CodeNotFound, "no host %s", name))
}
