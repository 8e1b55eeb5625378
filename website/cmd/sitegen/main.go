// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Command sitegen builds CapyCTL's documentation site: Markdown under
// website/content to static HTML with a navigation, the generated parts
// (CLI reference, exit codes, settings, job spec defaults, management
// routes) expanded from the code. It reads nothing from the network.
//
//	go run ./website/cmd/sitegen -src website/content -out website/public
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/capyctl/capyctl/website/docs"
)

func main() {
	src := flag.String("src", "website/content", "the Markdown pages")
	out := flag.String("out", "website/public", "where the HTML goes (replaced)")
	root := flag.String("root", ".", "the repository root, for included files")
	flag.Parse()
	pages, err := docs.Load(*src, *root)
	if err != nil {
		fmt.Fprintf(os.Stderr, "sitegen: %v\n", err)
		os.Exit(2)
	}
	if err := docs.Build(pages, *out); err != nil {
		fmt.Fprintf(os.Stderr, "sitegen: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("sitegen: %d pages in %s\n", len(pages), *out)
}
