// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package docs

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/capyctl/capyctl/cmd/capyctl/command"
	"github.com/capyctl/capyctl/core/api"
	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/config"
	"github.com/capyctl/capyctl/core/jobspec"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/fakeengine"
	"github.com/capyctl/capyctl/sdk/enginefacts"
	"github.com/capyctl/capyctl/sdk/hclbound"
)

// Generators produce the parts of pages that come from the code; a page
// asks for one with <!-- generated: name -->.
var Generators = map[string]func() (string, error){
	"cli-index":               cliIndex,
	"cli-commands":            cliCommands,
	"exit-codes":              exitCodes,
	"error-codes":             errorCodes,
	"settings":                settings,
	"jobspec-defaults":        jobspecDefaults,
	"jobspec-limits":          jobspecLimits,
	"management-routes":       managementRoutes,
	"engine-facts-vllm":       engineFacts("vllm"),
	"engine-facts-sglang":     engineFacts("sglang"),
	"engine-facts-llamacpp":   engineFacts("llamacpp"),
	"engine-facts-tensorfold": engineFacts("tensorfold"),
	"fake-facts-vllm":         fakeFacts("vllm"),
	"fake-facts-sglang":       fakeFacts("sglang"),
	"fake-facts-llamacpp":     fakeFacts("llamacpp"),
	"fake-facts-tensorfold":   fakeFacts("tensorfold"),
	"fake-behaviour-facts":    func() (string, error) { return fakeengine.BehaviourMarkdown(), nil },
}

// engineFacts renders a family's engine table (sdk/enginefacts), the one
// its driver and its fake engine read.
func engineFacts(family string) func() (string, error) {
	return func() (string, error) {
		e := enginefacts.Lookup(family)
		if e == nil {
			return "", fmt.Errorf("no engine table %q", family)
		}
		return e.Markdown(), nil
	}
}

// fakeFacts renders a family's fake engine facts
// (plugins-testkit/fakeengine/facts.go), kept apart from the driver's.
func fakeFacts(family string) func() (string, error) {
	return func() (string, error) {
		f := fakeengine.FactsFor(family)
		if f == nil {
			return "", fmt.Errorf("no fake engine facts %q", family)
		}
		return f.Markdown(), nil
	}
}

// GeneratorNames returns the generators' names, sorted.
func GeneratorNames() []string {
	out := make([]string, 0, len(Generators))
	for k := range Generators {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// cell escapes text for a Markdown table cell.
func cell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.ReplaceAll(s, "\n", " ")
}

func anchor(name string) string {
	return "capyctl-" + strings.ReplaceAll(name, " ", "-")
}

func cliIndex() (string, error) {
	table := command.Commands(&command.Meta{})
	var b strings.Builder
	b.WriteString("| command | what it does |\n|---|---|\n")
	for _, name := range command.CommandNames() {
		c, err := table[name]()
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "| [`capyctl %s`](#%s) | %s |\n", name, anchor(name), cell(c.Synopsis()))
	}
	return b.String(), nil
}

func cliCommands() (string, error) {
	table := command.Commands(&command.Meta{})
	var b strings.Builder
	for _, name := range command.CommandNames() {
		c, err := table[name]()
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "### capyctl %s\n\n%s.\n\n```text\n%s\n```\n\n", name, strings.TrimSuffix(c.Synopsis(), "."), strings.TrimRight(c.Help(), "\n"))
	}
	return b.String(), nil
}

func exitCodes() (string, error) {
	var b strings.Builder
	b.WriteString("| exit | meaning | error codes |\n|---|---|---|\n")
	for _, r := range command.ExitCodes() {
		codes := make([]string, 0, len(r.Codes))
		for _, c := range r.Codes {
			codes = append(codes, "`"+string(c.Code)+"`")
		}
		fmt.Fprintf(&b, "| %d | %s | %s |\n", r.Exit, cell(r.Meaning), strings.Join(codes, ", "))
	}
	return b.String(), nil
}

func errorCodes() (string, error) {
	var b strings.Builder
	b.WriteString("| code | HTTP | exit | retry | meaning |\n|---|---|---|---|---|\n")
	rows := structs.Catalogue()
	sort.Slice(rows, func(i, j int) bool { return rows[i].Code < rows[j].Code })
	for _, c := range rows {
		if c.Code == structs.CodeOK {
			continue
		}
		retry := "no"
		if c.Retryable {
			retry = "yes"
		}
		fmt.Fprintf(&b, "| `%s` | %d | %d | %s | %s |\n", c.Code, wire.HTTPStatus(c.Code), c.Exit, retry, cell(c.Summary))
	}
	return b.String(), nil
}

func settings() (string, error) {
	var b strings.Builder
	b.WriteString("| setting | environment | default | roles | description |\n|---|---|---|---|---|\n")
	for _, d := range config.Definitions() {
		def := d.DefaultText()
		if def == "" {
			def = "(empty)"
		}
		desc := d.Description
		if len(d.Values) > 0 {
			desc += " (one of " + strings.Join(d.Values, ", ") + ")"
		}
		fmt.Fprintf(&b, "| `%s` | `%s` | `%s` | %s | %s |\n", d.Path, d.Env, cell(def), strings.Join(d.Roles, ", "), cell(desc))
	}
	return b.String(), nil
}

// jobspecDefaults parses the smallest job spec and lists every field the
// completion filled in, with its value.
func jobspecDefaults() (string, error) {
	specs, err := jobspec.Parse([]byte("deployment \"demo\" {\n  engine = \"vllm\"\n  model {\n    path = \"demo\"\n  }\n}\n"), "minimal.hcl")
	if err != nil {
		return "", err
	}
	d := specs[0]
	values := flatten(d)
	keys := make([]string, 0, len(d.Provenance))
	for k, from := range d.Provenance {
		if from == jobspec.FromDefault {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString("| field | default |\n|---|---|\n")
	for _, k := range keys {
		v, ok := values[k]
		switch {
		case unsetNotes[k] != "":
			v = unsetNotes[k]
		case ok && v == "false":
			v = "`false`"
		case !ok || v == "" || v == "null" || v == "0" || v == "0s":
			v = "unset: the engine's own default"
		default:
			v = "`" + v + "`"
		}
		fmt.Fprintf(&b, "| `%s` | %s |\n", k, cell(v))
	}
	return b.String(), nil
}

// unsetNotes say what applies when a field is left out and the completion
// leaves it empty.
var unsetNotes = map[string]string{
	"routes":                                "`[\"<name>\"]`: the deployment's name",
	"residency":                             "unset: the engine's default residency (see the engine guides)",
	"resources":                             "unset: estimated by the driver from the checkpoint, then measured",
	"model.hf":                              "none",
	"model.revision":                        "none",
	"lifecycle.ready_idle_timeout":          "off",
	"lifecycle.parked_idle_timeout":         "off",
	"timeouts.initialize":                   "derived from the model's size and the engine",
	"timeouts.wake":                         "derived from the model's size and the engine",
	"timeouts.stop":                         "derived from the engine",
	"engine_config.max_concurrent_requests": "the driver's default (32 places at most per instance)",
	"engine_config.memory.request":          "derived by the driver",
	"engine_config.memory.kv_cache":         "derived by the driver",
	"engine_config.memory.startup":          "derived by the driver, then measured",
	"engine_config.env":                     "none",
	"engine_config.extra_args":              "none",
	"engine_config.accept_extra_args":       "`false`",
	"engine_config.trust_remote_code":       "`false`",
	"engine_config.cuda_graphs":             "the driver's default (on where the engine supports them)",
}

func flatten(d *structs.Deployment) map[string]string {
	data, _ := json.Marshal(d)
	var tree map[string]any
	_ = json.Unmarshal(data, &tree)
	out := map[string]string{}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		if m, ok := v.(map[string]any); ok {
			for k, sub := range m {
				p := k
				if prefix != "" {
					p = prefix + "." + k
				}
				walk(p, sub)
			}
			return
		}
		raw, _ := json.Marshal(v)
		out[prefix] = strings.Trim(string(raw), `"`)
	}
	walk("", tree)
	return out
}

func jobspecLimits() (string, error) {
	rows := []struct {
		what  string
		limit any
	}{
		{"`instances`", jobspec.MaxInstances},
		{"`topology.tensor_parallel`, `topology.pipeline_parallel`", jobspec.MaxParallel},
		{"`engine_config.max_concurrent_requests`", jobspec.MaxConcurrentRequests},
		{"`engine_config.context_length`", jobspec.MaxContextLength},
		{"`limits.max_waiting`", jobspec.MaxWaiting},
		{"`routes` (names per deployment)", jobspec.MaxRoutes},
		{"`engine_config.env` (names)", jobspec.MaxEnvNames},
		{"`engine_config.env` (bytes per value)", jobspec.MaxEnvValueBytes},
		{"deployment name", "`" + jobspec.NameRe.String() + "`"},
		{"route name", "`" + jobspec.RouteRe.String() + "`"},
		{"the file (before it is parsed)", fmt.Sprintf("%d bytes (1 MiB)", hclbound.MaxBytes)},
		{"nesting (before it is parsed)", fmt.Sprintf("%d levels", hclbound.MaxDepth)},
	}
	var b strings.Builder
	b.WriteString("| what | at most / form |\n|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %v |\n", r.what, r.limit)
	}
	return b.String(), nil
}

func managementRoutes() (string, error) {
	var b strings.Builder
	b.WriteString("| method | path | does | Idempotency-Key |\n|---|---|---|---|\n")
	for _, r := range api.ManagementRoutes() {
		key := ""
		if r.Idempotent {
			key = "yes"
		}
		fmt.Fprintf(&b, "| `%s` | `%s%s` | %s | %s |\n", r.Method, wire.Prefix, r.Path, cell(r.Summary), key)
	}
	return b.String(), nil
}
