// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine

// ToolCallID is llama-server's tool call ID: 32 random letters and
// digits (gen_tool_call_id, tools/server/utils.hpp).
func (l *LlamaCpp) ToolCallID() string {
	const alnum = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
	b := []byte(randHex(32))
	for i := range b {
		b[i] = alnum[int(b[i])%len(alnum)]
	}
	return string(b)
}
