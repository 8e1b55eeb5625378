// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package jobspec

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/hashicorp/hcl/v2"
)

// zeroRange marks a field present in a document without a position.
var zeroRange hcl.Range

// FromJSON decodes a structs.Deployment JSON document (the management
// API's body) strictly, refusing unknown fields, then completes and
// validates it as Parse does. Provenance is recomputed: "file" for the
// fields the document carries, "default" for the rest; a provenance map in
// the document is ignored.
func FromJSON(data []byte) (*structs.Deployment, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var d structs.Deployment
	if err := dec.Decode(&d); err != nil {
		return nil, diagError([]Diagnostic{{Summary: "invalid deployment document", Detail: err.Error()}})
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, diagError([]Diagnostic{{Summary: "invalid deployment document", Detail: "data after the JSON object"}})
	}
	// Family blocks are kept compact, as Parse writes them.
	for f, v := range d.EngineConfig.Family {
		var buf bytes.Buffer
		if json.Compact(&buf, v) == nil {
			d.EngineConfig.Family[f] = buf.Bytes()
		}
	}
	var raw map[string]any
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, diagError([]Diagnostic{{Summary: "invalid deployment document", Detail: err.Error()}})
	}
	present := fieldSet{}
	walkPresent(raw, "", present)
	complete(&d, present.has)
	if diags := validate(&d, nil, present.has); len(diags) > 0 {
		return nil, diagError(diags)
	}
	return &d, nil
}

// walkPresent records the field paths a JSON document sets (not null),
// spelled as in a job spec: resources.phases.<p> is resources.<p> and
// engine_config.family.<f> is engine_config.<f>.
func walkPresent(obj map[string]any, prefix string, out fieldSet) {
	for k, v := range obj {
		if v == nil {
			continue
		}
		p := prefix + k
		switch p {
		case "provenance", "source":
			continue
		case "resources.phases", "engine_config.family":
			if m, ok := v.(map[string]any); ok {
				walkPresent(m, strings.TrimSuffix(strings.TrimSuffix(p, "phases"), "family"), out)
			}
			continue
		}
		out[p] = zeroRange
		if p == "engine_config.env" {
			continue
		}
		if m, ok := v.(map[string]any); ok {
			walkPresent(m, p+".", out)
		}
	}
}
