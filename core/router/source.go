// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import "encoding/json"

// A source reads an engine's answer into a turn (turn.go): chat
// completion chunks (the translated path), or the engine's own Messages
// or Responses events (the native path).
type source interface {
	// event reads one event's data; done is true at the answer's last
	// event (an engine's stream that ends without [DONE]), failed carries
	// the message of a failure the engine reported in it.
	event(t *turn, payload []byte) (done bool, failed string)
	// whole reads an answer the engine sent as one JSON body.
	whole(t *turn, data []byte) error
}

// ---------------------------------------------------------------- chat

// chatSource reads chat completion chunks.
type chatSource struct{}

// chatUsage is a chat answer's usage.
type chatUsage struct {
	PromptTokens        *int64 `json:"prompt_tokens"`
	CompletionTokens    *int64 `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens *int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	CompletionTokensDetails *struct {
		ReasoningTokens *int64 `json:"reasoning_tokens"`
	} `json:"completion_tokens_details"`
}

func (u *chatUsage) into(t *turn) {
	if u.PromptTokens == nil && u.CompletionTokens == nil {
		return
	}
	t.usage.known = true
	if u.PromptTokens != nil {
		t.usage.input = *u.PromptTokens
	}
	if u.CompletionTokens != nil {
		t.usage.output = *u.CompletionTokens
	}
	if d := u.PromptTokensDetails; d != nil && d.CachedTokens != nil {
		t.usage.cached, t.usage.cachedOK = *d.CachedTokens, true
	}
	if d := u.CompletionTokensDetails; d != nil && d.ReasoningTokens != nil {
		t.usage.reasoning = *d.ReasoningTokens
	}
}

func (chatSource) event(t *turn, payload []byte) (bool, string) {
	var c chunkHead
	if decodeChunk(payload, &c) != nil {
		return false, ""
	}
	t.begin()
	if len(c.Usage) > 0 && string(c.Usage) != "null" {
		var u chatUsage
		if json.Unmarshal(c.Usage, &u) == nil {
			u.into(t)
		}
	}
	for i := range c.Choices {
		ch := &c.Choices[i]
		if ch.Index != 0 {
			continue // n is 1: one choice
		}
		d := &ch.Delta
		for _, s := range []*string{d.ReasoningContent, d.Reasoning} {
			if s != nil {
				t.reasoning(*s)
			}
		}
		for _, s := range []*string{d.Content, d.Refusal} {
			if s != nil {
				t.text(*s)
			}
		}
		for _, tc := range d.ToolCalls {
			if tc.ID != "" || tc.Function.Name != "" || t.tools[tc.Index] == nil {
				t.toolStart(tc.Index, tc.ID, tc.Function.Name)
			}
			t.toolArgs(tc.Index, tc.Function.Arguments)
		}
		if len(ch.FinishReason) > 0 && string(ch.FinishReason) != "null" {
			var r string
			if json.Unmarshal(ch.FinishReason, &r) == nil {
				t.setFinish(r)
				t.stopSeq = stopReasonOf(payload)
			}
		}
	}
	return false, ""
}

// stopReasonOf reads vLLM's choices[0].stop_reason: the stop string that
// ended the answer ("" for none, or for a stop token's number).
func stopReasonOf(payload []byte) string {
	var v struct {
		Choices []struct {
			StopReason json.RawMessage `json:"stop_reason"`
		} `json:"choices"`
	}
	if json.Unmarshal(payload, &v) != nil || len(v.Choices) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(v.Choices[0].StopReason, &s) != nil {
		return ""
	}
	return s
}

func (chatSource) whole(t *turn, data []byte) error {
	var v struct {
		Choices []struct {
			Message struct {
				Content          *string `json:"content"`
				ReasoningContent *string `json:"reasoning_content"`
				Reasoning        *string `json:"reasoning"`
				Refusal          *string `json:"refusal"`
				ToolCalls        []struct {
					ID       string `json:"id"`
					Function struct {
						Name      string `json:"name"`
						Arguments string `json:"arguments"`
					} `json:"function"`
				} `json:"tool_calls"`
			} `json:"message"`
			FinishReason *string         `json:"finish_reason"`
			StopReason   json.RawMessage `json:"stop_reason"`
		} `json:"choices"`
		Usage *chatUsage `json:"usage"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	t.begin()
	if v.Usage != nil {
		v.Usage.into(t)
	}
	if len(v.Choices) == 0 {
		return nil
	}
	ch := v.Choices[0]
	m := ch.Message
	for _, s := range []*string{m.ReasoningContent, m.Reasoning} {
		if s != nil {
			t.reasoning(*s)
		}
	}
	for _, s := range []*string{m.Content, m.Refusal} {
		if s != nil {
			t.text(*s)
		}
	}
	for i, tc := range m.ToolCalls {
		t.toolStart(i, tc.ID, tc.Function.Name)
		t.toolArgs(i, tc.Function.Arguments)
	}
	if ch.FinishReason != nil {
		t.setFinish(*ch.FinishReason)
		var s string
		if json.Unmarshal(ch.StopReason, &s) == nil {
			t.stopSeq = s
		}
	}
	return nil
}

// ---------------------------------------------------------------- Messages

// messagesSource reads an engine's own Anthropic Messages stream.
type messagesSource struct{}

// anthropicUsage is a Messages answer's usage.
type anthropicUsage struct {
	InputTokens          *int64 `json:"input_tokens"`
	OutputTokens         *int64 `json:"output_tokens"`
	CacheReadInputTokens *int64 `json:"cache_read_input_tokens"`
}

func (u *anthropicUsage) into(t *turn) {
	if u == nil {
		return
	}
	if u.InputTokens != nil {
		t.usage.known = true
		t.usage.input = *u.InputTokens
	}
	if u.OutputTokens != nil {
		t.usage.known = true
		t.usage.output = *u.OutputTokens
	}
	if u.CacheReadInputTokens != nil {
		t.usage.cached, t.usage.cachedOK = *u.CacheReadInputTokens, true
	}
}

// anthropicBlock is a Messages content block (an answer's or a stream's).
type anthropicBlock struct {
	Type     string          `json:"type"`
	Text     string          `json:"text"`
	Thinking string          `json:"thinking"`
	ID       string          `json:"id"`
	Name     string          `json:"name"`
	Input    json.RawMessage `json:"input"`
}

// stopOfAnthropic is a Messages stop reason in chat completion's words.
func stopOfAnthropic(r string) string {
	switch r {
	case "max_tokens":
		return finishLength
	case "tool_use":
		return finishToolCalls
	case "refusal":
		return finishContentFilter
	case "":
		return ""
	}
	return finishStop // end_turn, stop_sequence, pause_turn
}

func (messagesSource) block(t *turn, index int, b *anthropicBlock) {
	switch b.Type {
	case "text":
		t.text(b.Text)
	case "thinking":
		t.reasoning(b.Thinking)
	case "tool_use":
		t.toolStart(index, b.ID, b.Name)
		if in := string(b.Input); in != "" && in != "{}" && in != "null" {
			t.toolArgs(index, in)
		}
	}
}

func (s messagesSource) event(t *turn, payload []byte) (bool, string) {
	var ev struct {
		Type    string `json:"type"`
		Index   int    `json:"index"`
		Message *struct {
			Usage *anthropicUsage `json:"usage"`
		} `json:"message"`
		ContentBlock *anthropicBlock `json:"content_block"`
		Delta        *struct {
			Type         string  `json:"type"`
			Text         string  `json:"text"`
			PartialJSON  string  `json:"partial_json"`
			Thinking     string  `json:"thinking"`
			StopReason   *string `json:"stop_reason"`
			StopSequence *string `json:"stop_sequence"`
		} `json:"delta"`
		Usage *anthropicUsage `json:"usage"`
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(payload, &ev) != nil {
		return false, ""
	}
	switch ev.Type {
	case "message_start":
		// The usage first: the client's message_start carries it.
		if ev.Message != nil {
			ev.Message.Usage.into(t)
		}
		t.begin()
	case "content_block_start":
		if ev.ContentBlock != nil {
			s.block(t, ev.Index, ev.ContentBlock)
		}
	case "content_block_delta":
		if d := ev.Delta; d != nil {
			switch d.Type {
			case "text_delta":
				t.text(d.Text)
			case "thinking_delta":
				t.reasoning(d.Thinking)
			case "input_json_delta":
				t.toolArgs(ev.Index, d.PartialJSON)
			}
		}
	case "message_delta":
		if d := ev.Delta; d != nil {
			if d.StopReason != nil {
				t.setFinish(stopOfAnthropic(*d.StopReason))
			}
			if d.StopSequence != nil {
				t.stopSeq = *d.StopSequence
			}
		}
		ev.Usage.into(t)
	case "message_stop":
		return true, ""
	case "error":
		msg := "the engine reported an error"
		if ev.Error != nil && ev.Error.Message != "" {
			msg = ev.Error.Message
		}
		return false, msg
	}
	return false, ""
}

func (s messagesSource) whole(t *turn, data []byte) error {
	var v struct {
		Content      []anthropicBlock `json:"content"`
		StopReason   *string          `json:"stop_reason"`
		StopSequence *string          `json:"stop_sequence"`
		Usage        *anthropicUsage  `json:"usage"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	t.begin()
	v.Usage.into(t)
	for i := range v.Content {
		s.block(t, i, &v.Content[i])
	}
	if v.StopReason != nil {
		t.setFinish(stopOfAnthropic(*v.StopReason))
	}
	if v.StopSequence != nil {
		t.stopSeq = *v.StopSequence
	}
	return nil
}

// ---------------------------------------------------------------- Responses

// responsesSource reads an engine's own Responses stream.
type responsesSource struct {
	// texted are the output indexes that had text deltas, so that a
	// done event repeating the whole text adds nothing to them.
	texted map[int]bool
}

// responsesUsage is a Responses answer's usage.
type responsesUsage struct {
	InputTokens        *int64 `json:"input_tokens"`
	OutputTokens       *int64 `json:"output_tokens"`
	InputTokensDetails *struct {
		CachedTokens *int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokensDetails *struct {
		ReasoningTokens *int64 `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
}

func (u *responsesUsage) into(t *turn) {
	if u == nil || (u.InputTokens == nil && u.OutputTokens == nil) {
		return
	}
	t.usage.known = true
	if u.InputTokens != nil {
		t.usage.input = *u.InputTokens
	}
	if u.OutputTokens != nil {
		t.usage.output = *u.OutputTokens
	}
	if d := u.InputTokensDetails; d != nil && d.CachedTokens != nil {
		t.usage.cached, t.usage.cachedOK = *d.CachedTokens, true
	}
	if d := u.OutputTokensDetails; d != nil && d.ReasoningTokens != nil {
		t.usage.reasoning = *d.ReasoningTokens
	}
}

// responsesItem is a Responses output item.
type responsesItem struct {
	Type      string `json:"type"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
	Content   []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	Summary []struct {
		Text string `json:"text"`
	} `json:"summary"`
}

// responsesEnd is the final response object of a Responses stream.
type responsesEnd struct {
	Status            string          `json:"status"`
	Usage             *responsesUsage `json:"usage"`
	Output            []responsesItem `json:"output"`
	IncompleteDetails *struct {
		Reason string `json:"reason"`
	} `json:"incomplete_details"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// finishOf is the chat finish reason of a final response object.
func (r *responsesEnd) finishOf(t *turn) string {
	if r.Status == "incomplete" && r.IncompleteDetails != nil {
		if r.IncompleteDetails.Reason == "content_filter" {
			return finishContentFilter
		}
		return finishLength
	}
	if t.hasTools() {
		return finishToolCalls
	}
	return finishStop
}

func (s *responsesSource) event(t *turn, payload []byte) (bool, string) {
	var ev struct {
		Type        string          `json:"type"`
		OutputIndex int             `json:"output_index"`
		Item        *responsesItem  `json:"item"`
		Delta       string          `json:"delta"`
		Text        string          `json:"text"`
		Arguments   string          `json:"arguments"`
		Response    *responsesEnd   `json:"response"`
		Message     string          `json:"message"`
		Code        json.RawMessage `json:"code"`
	}
	if json.Unmarshal(payload, &ev) != nil {
		return false, ""
	}
	switch ev.Type {
	case "response.created", "response.in_progress":
		t.begin()
	case "response.output_item.added":
		if it := ev.Item; it != nil && it.Type == "function_call" {
			t.toolStart(ev.OutputIndex, it.CallID, it.Name)
			t.toolArgs(ev.OutputIndex, it.Arguments)
		}
	case "response.output_text.delta", "response.refusal.delta":
		s.mark(ev.OutputIndex)
		t.text(ev.Delta)
	case "response.output_text.done":
		if !s.texted[ev.OutputIndex] {
			s.mark(ev.OutputIndex)
			t.text(ev.Text)
		}
	case "response.reasoning_text.delta", "response.reasoning_summary_text.delta":
		s.mark(ev.OutputIndex)
		t.reasoning(ev.Delta)
	case "response.function_call_arguments.delta":
		t.toolArgs(ev.OutputIndex, ev.Delta)
	case "response.function_call_arguments.done":
		if it := t.tools[ev.OutputIndex]; it != nil && it.args.Len() == 0 {
			t.toolArgs(ev.OutputIndex, ev.Arguments)
		}
	case "response.completed", "response.incomplete":
		if r := ev.Response; r != nil {
			r.Usage.into(t)
			t.setFinish(r.finishOf(t))
		}
		return true, ""
	case "response.failed":
		msg := "the engine's response failed"
		if r := ev.Response; r != nil && r.Error != nil && r.Error.Message != "" {
			msg = r.Error.Message
		}
		return false, msg
	case "error":
		msg := ev.Message
		if msg == "" {
			msg = "the engine reported an error"
		}
		return false, msg
	}
	return false, ""
}

func (s *responsesSource) mark(i int) {
	if s.texted == nil {
		s.texted = map[int]bool{}
	}
	s.texted[i] = true
}

func (s *responsesSource) whole(t *turn, data []byte) error {
	var r responsesEnd
	if err := json.Unmarshal(data, &r); err != nil {
		return err
	}
	t.begin()
	r.Usage.into(t)
	for i, it := range r.Output {
		switch it.Type {
		case "message":
			for _, c := range it.Content {
				t.text(c.Text)
			}
		case "reasoning":
			for _, c := range it.Content {
				t.reasoning(c.Text)
			}
			if len(it.Content) == 0 {
				for _, c := range it.Summary {
					t.reasoning(c.Text)
				}
			}
		case "function_call":
			t.toolStart(i, it.CallID, it.Name)
			t.toolArgs(i, it.Arguments)
		}
	}
	t.setFinish(r.finishOf(t))
	return nil
}
