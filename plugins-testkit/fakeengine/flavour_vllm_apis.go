// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine

// vllmAPIRoutes are vLLM's routes for the APIs beyond chat: Anthropic's
// Messages and its token count (vllm/entrypoints/anthropic/api_router.py)
// and OpenAI's Responses (vllm/entrypoints/openai/responses/api_router.py).
func vllmAPIRoutes(e *Engine) []Route {
	return []Route{
		{Pattern: "POST /v1/messages", Handler: e.AnthropicMessagesHandler()},
		{Pattern: "POST /v1/messages/count_tokens", Handler: e.AnthropicCountTokensHandler()},
		{Pattern: "POST /v1/responses", Handler: e.ResponsesHandler()},
	}
}

// ToolCallID is vLLM's tool call ID: "chatcmpl-tool-" and a random UUID's
// hex (random_tool_call_id, vllm/entrypoints/chat_utils.py).
func (v *VLLM) ToolCallID() string { return "chatcmpl-tool-" + randHex(16) }
