// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine

// APIRoute is a route beyond chat completions that a fake engine serves
// because its engine does (Anthropic's Messages API and its token count,
// OpenAI's Responses API), with where it was read.
type APIRoute struct {
	// Pattern is the route as the fake's mux has it ("POST /v1/messages").
	Pattern string
	// Note says how the fake answers it.
	Note string
	// Source is the engine's file (and commit) that shows it.
	Source string
}

// APIRoutes are each fake's routes beyond chat, by engine family: the
// fake's own facts (the drivers keep theirs in sdk/enginefacts). A family
// without an entry serves chat only: its Messages and Responses requests
// reach it translated to chat.
var APIRoutes = map[string][]APIRoute{
	"vllm": {
		{Pattern: "POST /v1/messages", Note: "converted to a chat generation; message_start (prompt usage), content blocks, message_delta, message_stop; no ping",
			Source: "vllm/entrypoints/anthropic/api_router.py and serving.py (commit 01540b75)"},
		{Pattern: "POST /v1/messages/count_tokens", Note: "the prompt's tokens as a generation counts them: {\"input_tokens\":N}",
			Source: "vllm/entrypoints/anthropic/api_router.py (commit 01540b75)"},
		{Pattern: "POST /v1/responses", Note: "converted to a chat generation; typed events with sequence numbers; keeps nothing (store false, previous_response_id not found) as without VLLM_ENABLE_RESPONSES_API_STORE",
			Source: "vllm/entrypoints/openai/responses/serving.py (commit 0001948b)"},
	},
	// llama-server b4748, the build the fake reproduces, predates
	// /v1/messages and /v1/messages/count_tokens (llama.cpp pull request
	// #17570, November 2025): it answers them 404, as that build does.
	"llamacpp": nil,
}
