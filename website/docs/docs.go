// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package docs builds CapyCTL's documentation site: it reads the Markdown
// pages under website/content, expands the generated parts (the CLI
// reference and exit codes from the command table and the error catalogue,
// the settings from core/config, the job spec's defaults and limits from
// core/jobspec, included example programs), and renders static HTML with
// a navigation. Nothing is fetched from the network. The same expanded
// pages feed the doc-example test, so what the site shows is what is
// tested.
package docs

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/yuin/goldmark"
	"github.com/yuin/goldmark/ast"
	"github.com/yuin/goldmark/extension"
	"github.com/yuin/goldmark/parser"
	"github.com/yuin/goldmark/text"
	"github.com/yuin/goldmark/util"
)

// Page is one documentation page.
type Page struct {
	// Path is the page's path under the content directory
	// ("guides/controller.md").
	Path string
	// Title is the text of the page's first "# " heading.
	Title string
	// Section is the first directory of Path ("" for the top level).
	Section string
	// Order sorts pages within a section (<!-- order: N -->; 100 when
	// unset), then the title.
	Order int
	// Source is the Markdown with the generated parts expanded.
	Source []byte
}

// HTMLPath is the page's output path ("guides/controller.html").
func (p *Page) HTMLPath() string { return strings.TrimSuffix(p.Path, ".md") + ".html" }

// Sections are the navigation's sections in order, by directory; a
// directory not listed here comes after them, titled by its name.
var Sections = []struct{ Dir, Title string }{
	{"", "Start here"},
	{"concepts", "Concepts"},
	{"guides", "Guides"},
	{"engines", "Engines"},
	{"reference", "Reference"},
	{"operations", "Operations"},
}

var (
	orderRe     = regexp.MustCompile(`(?m)^<!--\s*order:\s*(\d+)\s*-->\s*$`)
	generatedRe = regexp.MustCompile(`(?m)^<!--\s*generated:\s*([a-z0-9-]+)\s*-->\s*$`)
	includeRe   = regexp.MustCompile(`(?m)^<!--\s*include:\s*(\S+)\s+(\S+)\s*-->\s*$`)
	titleRe     = regexp.MustCompile(`(?m)^# (.+)$`)
	// placeholderRe finds pages that are not finished.
	placeholderRe = regexp.MustCompile(`(?i)\b(TODO|TBD|FIXME|lorem ipsum)\b`)
)

// Load reads every page under contentDir and expands its generated parts.
// repoRoot resolves <!-- include: path lang --> markers.
func Load(contentDir, repoRoot string) ([]*Page, error) {
	var pages []*Page
	err := filepath.WalkDir(contentDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || !strings.HasSuffix(p, ".md") {
			return nil
		}
		rel, err := filepath.Rel(contentDir, p)
		if err != nil {
			return err
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		page, err := newPage(filepath.ToSlash(rel), src, repoRoot)
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		pages = append(pages, page)
		return nil
	})
	if err != nil {
		return nil, err
	}
	sortPages(pages)
	return pages, nil
}

func newPage(rel string, src []byte, repoRoot string) (*Page, error) {
	p := &Page{Path: rel, Order: 100}
	if i := strings.IndexByte(rel, '/'); i >= 0 {
		p.Section = rel[:i]
	}
	if m := orderRe.FindSubmatch(src); m != nil {
		p.Order, _ = strconv.Atoi(string(m[1]))
	}
	m := titleRe.FindSubmatch(src)
	if m == nil {
		return nil, fmt.Errorf("no \"# Title\" heading")
	}
	p.Title = strings.TrimSpace(string(m[1]))
	if loc := placeholderRe.FindIndex(src); loc != nil {
		return nil, fmt.Errorf("an unfinished page: %q", src[loc[0]:loc[1]])
	}
	var expandErr error
	out := generatedRe.ReplaceAllFunc(src, func(marker []byte) []byte {
		name := string(generatedRe.FindSubmatch(marker)[1])
		gen, ok := Generators[name]
		if !ok {
			expandErr = fmt.Errorf("no generator %q (one of %s)", name, strings.Join(GeneratorNames(), ", "))
			return marker
		}
		text, err := gen()
		if err != nil {
			expandErr = fmt.Errorf("generate %s: %w", name, err)
			return marker
		}
		return []byte(strings.TrimRight(text, "\n") + "\n")
	})
	out = includeRe.ReplaceAllFunc(out, func(marker []byte) []byte {
		sm := includeRe.FindSubmatch(marker)
		file, lang := string(sm[1]), string(sm[2])
		data, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(file)))
		if err != nil {
			expandErr = fmt.Errorf("include %s: %w", file, err)
			return marker
		}
		return []byte(fmt.Sprintf("```%s file=%s\n%s```\n", lang, file, strings.TrimRight(string(data), "\n")+"\n"))
	})
	if expandErr != nil {
		return nil, expandErr
	}
	out = orderRe.ReplaceAll(out, nil)
	p.Source = out
	return p, nil
}

func sectionIndex(dir string) int {
	for i, s := range Sections {
		if s.Dir == dir {
			return i
		}
	}
	return len(Sections)
}

// SectionTitle returns a section's title.
func SectionTitle(dir string) string {
	if i := sectionIndex(dir); i < len(Sections) {
		return Sections[i].Title
	}
	return strings.ToUpper(dir[:1]) + dir[1:]
}

func sortPages(pages []*Page) {
	sort.SliceStable(pages, func(i, j int) bool {
		a, b := pages[i], pages[j]
		if sa, sb := sectionIndex(a.Section), sectionIndex(b.Section); sa != sb || a.Section != b.Section {
			if sa != sb {
				return sa < sb
			}
			return a.Section < b.Section
		}
		if a.Order != b.Order {
			return a.Order < b.Order
		}
		return a.Title < b.Title
	})
}

// Markdown returns the Markdown engine the site uses: GitHub tables,
// heading IDs, and links to .md pages rewritten to .html.
func Markdown() goldmark.Markdown {
	return goldmark.New(
		goldmark.WithExtensions(extension.GFM),
		goldmark.WithParserOptions(
			parser.WithAutoHeadingID(),
			parser.WithASTTransformers(util.Prioritized(mdLinks{}, 100)),
		),
	)
}

// mdLinks rewrites relative links to .md pages into .html.
type mdLinks struct{}

func (mdLinks) Transform(doc *ast.Document, _ text.Reader, _ parser.Context) {
	_ = ast.Walk(doc, func(n ast.Node, entering bool) (ast.WalkStatus, error) {
		if l, ok := n.(*ast.Link); ok && entering {
			dest := string(l.Destination)
			if !strings.Contains(dest, "://") && !strings.HasPrefix(dest, "#") {
				file, frag, _ := strings.Cut(dest, "#")
				if strings.HasSuffix(file, ".md") {
					dest = strings.TrimSuffix(file, ".md") + ".html"
					if frag != "" {
						dest += "#" + frag
					}
					l.Destination = []byte(dest)
				}
			}
		}
		return ast.WalkContinue, nil
	})
}

// Block is one fenced code block of a page.
type Block struct {
	Page string
	// Line is the block's first line in the expanded page (1-based).
	Line int
	// Lang is the info string's first word ("sh", "hcl", "json", "go").
	Lang string
	// Attrs are the info string's other words: "run", or key=value
	// ("file=demo.hcl", "wire=Snapshot").
	Attrs map[string]string
	Code  string
}

// Blocks returns a page's fenced code blocks, in order.
func (p *Page) Blocks() []Block {
	src := p.Source
	doc := Markdown().Parser().Parse(text.NewReader(src))
	var out []Block
	_ = ast.Walk(doc, func(n ast.Node, entering bool) (ast.WalkStatus, error) {
		fb, ok := n.(*ast.FencedCodeBlock)
		if !ok || !entering {
			return ast.WalkContinue, nil
		}
		var info string
		if fb.Info != nil {
			info = string(fb.Info.Segment.Value(src))
		}
		fields := strings.Fields(info)
		b := Block{Page: p.Path, Attrs: map[string]string{}}
		if len(fields) > 0 {
			b.Lang = fields[0]
			for _, f := range fields[1:] {
				k, v, _ := strings.Cut(f, "=")
				b.Attrs[k] = v
			}
		}
		var buf bytes.Buffer
		lines := fb.Lines()
		for i := 0; i < lines.Len(); i++ {
			seg := lines.At(i)
			buf.Write(seg.Value(src))
		}
		b.Code = buf.String()
		if lines.Len() > 0 {
			b.Line = bytes.Count(src[:lines.At(0).Start], []byte("\n")) + 1
		}
		out = append(out, b)
		return ast.WalkSkipChildren, nil
	})
	return out
}

// Build renders pages into outDir: one HTML file per page, a style sheet,
// and index.html (the page content/index.md, which must exist).
func Build(pages []*Page, outDir string) error {
	if err := os.RemoveAll(outDir); err != nil {
		return err
	}
	md := Markdown()
	for _, p := range pages {
		var body bytes.Buffer
		if err := md.Convert(p.Source, &body); err != nil {
			return fmt.Errorf("%s: %w", p.Path, err)
		}
		html, err := renderPage(p, pages, body.String())
		if err != nil {
			return err
		}
		dst := filepath.Join(outDir, filepath.FromSlash(p.HTMLPath()))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(dst, []byte(html), 0o644); err != nil {
			return err
		}
	}
	if _, err := os.Stat(filepath.Join(outDir, "index.html")); err != nil {
		return fmt.Errorf("no index.md page: %w", err)
	}
	return os.WriteFile(filepath.Join(outDir, "style.css"), []byte(styleCSS), 0o644)
}

// rel returns the link from page from to the site path to.
func rel(from, to string) string {
	depth := strings.Count(from, "/")
	return strings.Repeat("../", depth) + to
}

// pathDir is path.Dir without "." for the top level.
func pathDir(p string) string {
	d := path.Dir(p)
	if d == "." {
		return ""
	}
	return d
}
