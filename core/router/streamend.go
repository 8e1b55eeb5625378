// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"strings"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
)

// StreamFailure returns the events that end a stream of the inference
// endpoint path with err once the stream has begun, as the router ends its
// own streams (request.fail): the error envelope then [DONE] for the
// OpenAI chat and completions endpoints, an error event for Anthropic's
// Messages. nil where no such ending can be written without the answer's
// own state (the Responses API's response.failed names the response and
// numbers its events): the caller then cuts the stream, which a client
// reads as an answer broken off. A server relaying a host's stream ends it
// so when the host's answer breaks off.
func StreamFailure(path string, err error) []byte {
	e := structs.AsError(err)
	switch {
	case strings.HasPrefix(path, ResponsesPath):
		return nil
	case strings.HasPrefix(path, MessagesPath):
		data := anthropicErrorJSON(e, wire.HTTPStatus(e.Code), "")
		b := make([]byte, 0, len(data)+24)
		b = append(b, "event: error\ndata: "...)
		b = append(b, data...)
		return append(b, "\n\n"...)
	}
	env := errorJSON(e, e.Info())
	b := make([]byte, 0, len(env)+24)
	b = append(b, "data: "...)
	b = append(b, env[:len(env)-1]...)
	return append(b, "\n\ndata: [DONE]\n\n"...)
}
