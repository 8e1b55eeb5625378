// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package structs

import (
	"bytes"
	"encoding/json"
)

// SameSpec reports whether two specs of a deployment ask for the same
// thing: equal in every field an operator writes or a default fills,
// whichever file and line they came from and whatever the provenance of
// their defaults (Source, Provenance), and whatever group membership a
// server gave the instance (Group). A deploy of the same spec is a no-op
// (capyctl deploy --file twice); any other difference is a new revision.
func SameSpec(a, b *Deployment) bool {
	if a == nil || b == nil {
		return a == b
	}
	ka, errA := specKey(*a)
	kb, errB := specKey(*b)
	// A spec that does not encode is never the same as another.
	return errA == nil && errB == nil && bytes.Equal(ka, kb)
}

// specKey is the spec's JSON form without the fields SameSpec ignores.
func specKey(d Deployment) ([]byte, error) {
	d.Source, d.Provenance, d.Group = "", nil, nil
	return json.Marshal(d)
}
