// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package docs

import (
	"bytes"
	"html/template"
)

type navLink struct {
	Title, Href string
	Current     bool
}

type navSection struct {
	Title string
	Pages []navLink
}

var pageTemplate = template.Must(template.New("page").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}} · CapyCTL</title>
<link rel="stylesheet" href="{{.CSS}}">
</head>
<body>
<header class="top"><a class="brand" href="{{.Home}}">CapyCTL</a><span class="tag">your models, your GPUs, one endpoint</span></header>
<div class="layout">
<nav class="side" aria-label="Documentation">
{{- range .Nav}}
<div class="section"><div class="section-title">{{.Title}}</div><ul>
{{- range .Pages}}<li{{if .Current}} class="current"{{end}}><a href="{{.Href}}">{{.Title}}</a></li>{{end}}
</ul></div>
{{- end}}
</nav>
<main class="content">
{{.Body}}
</main>
</div>
<footer class="foot">CapyCTL documentation · built from website/content by website/cmd/sitegen · Apache-2.0</footer>
</body>
</html>
`))

func renderPage(p *Page, pages []*Page, body string) (string, error) {
	var nav []navSection
	for _, q := range pages {
		title := SectionTitle(q.Section)
		if len(nav) == 0 || nav[len(nav)-1].Title != title {
			nav = append(nav, navSection{Title: title})
		}
		s := &nav[len(nav)-1]
		s.Pages = append(s.Pages, navLink{Title: q.Title, Href: rel(p.Path, q.HTMLPath()), Current: q == p})
	}
	var buf bytes.Buffer
	err := pageTemplate.Execute(&buf, map[string]any{
		"Title": p.Title,
		"CSS":   rel(p.Path, "style.css"),
		"Home":  rel(p.Path, "index.html"),
		"Nav":   nav,
		// The body is goldmark's rendering of our own pages, which escape
		// raw HTML (goldmark's default).
		"Body": template.HTML(body), //nolint:gosec
	})
	return buf.String(), err
}

const styleCSS = `:root { --fg: #1d2330; --muted: #5b6577; --accent: #8a5a2b; --bg: #fbfaf7; --side: #f1ede4; --code: #f3f1ec; --line: #e2dccf; }
* { box-sizing: border-box; }
body { margin: 0; font: 16px/1.6 -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; color: var(--fg); background: var(--bg); }
a { color: var(--accent); }
.top { display: flex; align-items: baseline; gap: 1rem; padding: .8rem 1.5rem; border-bottom: 1px solid var(--line); background: #fff; }
.brand { font-weight: 700; font-size: 1.3rem; text-decoration: none; color: var(--fg); }
.tag { color: var(--muted); font-size: .9rem; }
.layout { display: flex; align-items: flex-start; }
.side { flex: 0 0 16rem; padding: 1rem 1.2rem; background: var(--side); min-height: calc(100vh - 3.5rem); border-right: 1px solid var(--line); font-size: .93rem; }
.section { margin-bottom: 1rem; }
.section-title { font-weight: 700; text-transform: uppercase; font-size: .75rem; letter-spacing: .06em; color: var(--muted); margin-bottom: .3rem; }
.side ul { list-style: none; margin: 0; padding: 0; }
.side li a { display: block; padding: .15rem .4rem; border-radius: 4px; text-decoration: none; color: var(--fg); }
.side li.current a { background: #fff; font-weight: 600; color: var(--accent); }
.content { flex: 1; max-width: 52rem; padding: 1.5rem 2.5rem 4rem; min-width: 0; }
.content h1 { font-size: 2rem; margin-top: .3rem; }
.content h2 { margin-top: 2.2rem; border-bottom: 1px solid var(--line); padding-bottom: .2rem; }
pre { background: var(--code); border: 1px solid var(--line); border-radius: 6px; padding: .8rem 1rem; overflow-x: auto; font-size: .87rem; line-height: 1.45; }
code { font-family: "SFMono-Regular", Menlo, Consolas, "Liberation Mono", monospace; font-size: .9em; }
p code, li code, td code { background: var(--code); padding: .05rem .3rem; border-radius: 4px; }
table { border-collapse: collapse; margin: 1rem 0; font-size: .92rem; display: block; overflow-x: auto; }
th, td { border: 1px solid var(--line); padding: .35rem .6rem; text-align: left; vertical-align: top; }
th { background: var(--side); }
blockquote { margin: 1rem 0; padding: .2rem 1rem; border-left: 4px solid var(--accent); background: #fff; color: var(--muted); }
.foot { padding: 1rem 1.5rem; color: var(--muted); font-size: .8rem; border-top: 1px solid var(--line); }
@media (max-width: 800px) { .layout { display: block; } .side { min-height: 0; border-right: 0; } .content { padding: 1rem; } }
`
