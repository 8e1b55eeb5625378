// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pyengine

import (
	"strings"

	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/flags"
	"github.com/capyctl/capyctl/sdk/formats"
)

// Parser provenances (Parsers.provenance).
const (
	ProvenanceDeclared      = "declared"
	ProvenanceOff           = "off"
	ProvenanceExtraArgs     = "extra_args"
	ProvenanceModelFamily   = "model_family"
	ProvenanceUnknownFamily = "unknown_family"
	ProvenanceUnsupported   = "unsupported"
)

// ParserNames are a family's names of the parsers CapyCTL picks by model
// family (the engines name the Qwen3 tool-call format differently).
type ParserNames struct {
	// Qwen3Tool is the tool-call parser of Qwen3 checkpoints (vLLM
	// "hermes", SGLang "qwen25").
	Qwen3Tool string
	// CoderTool is the parser of the <function=...> tool-call format
	// (Qwen3.5 and later, coder templates): "qwen3_coder".
	CoderTool string
	// Reasoning is the reasoning parser of Qwen3 thinking models: "qwen3".
	Reasoning string
}

// ParserInput is what ChooseParsers decides from.
type ParserInput struct {
	// ModelDir holds config.json and the chat template.
	ModelDir string
	// API is "chat", "decisions", "embeddings" or "rerank" (decision,
	// embedding and rerank models run without parsers).
	API string
	// Tool and Reasoning are engine_config.<family>.tool_call_parser and
	// reasoning_parser: "", "auto", "none" or a parser name.
	Tool, Reasoning string
	// Args are the deployment's extra_args, parsed: a parser there wins.
	Args []flags.Arg
	// ToolOption and ReasoningOption are the family's option names.
	ToolOption, ReasoningOption string
}

// Chosen is the parsers to render and what to report.
type Chosen struct {
	// Tool and Reasoning are the parsers CapyCTL renders, "" for none
	// (a parser in extra_args is rendered by extra_args, not here).
	Tool, Reasoning string
	// Report is what status shows (the effective parsers, with their
	// provenance).
	Report *sdk.Parsers
}

// ChooseParsers picks the tool-call and reasoning parsers: a parser in
// extra_args wins, then an explicit choice (a name, or "none"), then the
// model family ("auto", the default) read from config.json and the chat
// template: Qwen3 (qwen3, qwen3_moe) gets names.Qwen3Tool and the
// reasoning parser, Qwen3.5, 3.6 and 3.8 (qwen3_5*, qwen3_6*, qwen3_8*) and
// any Qwen3 template with "<function=" get names.CoderTool, and a template
// without "<think>" gets no reasoning parser. Other families get none.
func ChooseParsers(in ParserInput, names ParserNames) Chosen {
	if in.API == "decisions" || in.API == "embeddings" || in.API == "rerank" {
		return Chosen{Report: &sdk.Parsers{Provenance: ProvenanceUnsupported}}
	}
	famTool, famReasoning, known := familyParsers(in.ModelDir, names)
	var provs []string
	pick := func(option, declared, fromFamily string) (render, effective string) {
		if a := flags.Find(in.Args, option); a != nil {
			provs = append(provs, ProvenanceExtraArgs)
			if len(a.Values) > 0 {
				return "", a.Values[0]
			}
			return "", ""
		}
		switch declared {
		case "", "auto":
			if known {
				provs = append(provs, ProvenanceModelFamily)
			} else {
				provs = append(provs, ProvenanceUnknownFamily)
			}
			return fromFamily, fromFamily
		case "none":
			provs = append(provs, ProvenanceOff)
			return "", ""
		}
		provs = append(provs, ProvenanceDeclared)
		return declared, declared
	}
	var out Chosen
	out.Report = &sdk.Parsers{}
	out.Tool, out.Report.ToolCall = pick(in.ToolOption, in.Tool, famTool)
	out.Reasoning, out.Report.Reasoning = pick(in.ReasoningOption, in.Reasoning, famReasoning)
	out.Report.Provenance = strongest(provs)
	return out
}

// strongest is the provenance to report for the two parsers together.
func strongest(provs []string) string {
	for _, p := range []string{ProvenanceExtraArgs, ProvenanceDeclared, ProvenanceModelFamily, ProvenanceOff, ProvenanceUnknownFamily} {
		for _, q := range provs {
			if q == p {
				return p
			}
		}
	}
	return ProvenanceUnknownFamily
}

// familyParsers reads the checkpoint's family and chat template.
func familyParsers(dir string, names ParserNames) (tool, reasoning string, known bool) {
	if dir == "" {
		return "", "", false
	}
	cfg, err := formats.ReadHFConfig(dir)
	if err != nil {
		return "", "", false
	}
	mt := cfg.ModelType
	tmpl, _ := formats.HFChatTemplate(dir)
	switch {
	case mt == "qwen3" || mt == "qwen3_moe":
		tool, reasoning = names.Qwen3Tool, names.Reasoning
	case strings.HasPrefix(mt, "qwen3_5") || strings.HasPrefix(mt, "qwen3_6") || strings.HasPrefix(mt, "qwen3_8"):
		tool, reasoning = names.CoderTool, names.Reasoning
	default:
		return "", "", false
	}
	if strings.Contains(tmpl, "<function=") {
		tool = names.CoderTool
	}
	if tmpl != "" && !strings.Contains(tmpl, "<think>") {
		reasoning = ""
	}
	return tool, reasoning, true
}
