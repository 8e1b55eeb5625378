// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package docs_test

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
	"github.com/capyctl/capyctl/sdk/enginefacts"
)

// exposureLine is a status line an engine page shows for an engine on a
// loopback port.
var exposureLine = regexp.MustCompile(`exposure: loopback TCP: (.+?) answer any local user without the key`)

// TestEnginePages_RenderTheirTables proves that each engine page shows its
// engine table (the one its driver reads) and its fake engine's own facts,
// and that the exposure
// lines it quotes list exactly the table's open routes.
func TestEnginePages_RenderTheirTables(t *testing.T) {
	byPath := map[string][]byte{}
	for _, p := range loadPages(t) {
		byPath[p.Path] = p.Source
	}
	for _, e := range enginefacts.Engines() {
		t.Run(e.Family, func(t *testing.T) {
			src, ok := byPath["engines/"+e.Family+".md"]
			if !ok {
				t.Fatalf("no page engines/%s.md", e.Family)
			}
			if !bytes.Contains(src, []byte(e.Markdown())) {
				t.Errorf("engines/%s.md does not render its engine table (<!-- generated: engine-facts-%s -->)", e.Family, e.Family)
			}
			if f := fakeengine.FactsFor(e.Family); f == nil || !bytes.Contains(src, []byte(f.Markdown())) {
				t.Errorf("engines/%s.md does not render its fake engine's facts (<!-- generated: fake-facts-%s -->)", e.Family, e.Family)
			}
			want := strings.Join(append(enginefacts.Values(e.OpenRoutes), enginefacts.Values(e.ParkOpenRoutes)...), ", ")
			for _, m := range exposureLine.FindAllSubmatch(src, -1) {
				if string(m[1]) != want {
					t.Errorf("engines/%s.md quotes open routes %q; the table has %q", e.Family, m[1], want)
				}
			}
		})
	}
}
