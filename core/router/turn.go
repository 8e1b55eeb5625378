// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"encoding/json"
	"strconv"
	"strings"
)

// An answer in the router's own terms. The Responses and Messages APIs
// (responses.go, messages.go) are answered from whatever the engine's
// route speaks — chat completion chunks when the router translates, the
// engine's own Responses or Messages events when it serves them natively
// (source.go) — and every source feeds the same turn, which feeds the
// client's encoder. So both paths give a client the same events, in the
// same order, with CapyCTL's IDs.

// itemKind is the kind of one output item of an answer.
type itemKind uint8

const (
	itemText      itemKind = iota + 1 // text for the user
	itemReasoning                     // the model's reasoning, where the engine separates it
	itemTool                          // one function call
)

// turnItem is one output item: a Responses output item, a Messages
// content block.
type turnItem struct {
	kind  itemKind
	index int    // its position in the answer
	id    string // its ID in the client's API (msg_, rs_, fc_), for Responses
	text  strings.Builder
	// A function call's ID (the engine's, else one of CapyCTL's), name
	// and arguments (JSON text, as the model wrote it).
	callID string
	name   string
	args   strings.Builder
	closed bool
}

// turnSink receives an answer's items as they form: a client's stream
// encoder. A client that asked for no stream has none.
type turnSink interface {
	begin()
	open(it *turnItem)
	delta(it *turnItem, s string)
	close(it *turnItem)
}

// Finish reasons of a turn, in chat completion's words.
const (
	finishStop          = "stop"
	finishLength        = "length"
	finishToolCalls     = "tool_calls"
	finishContentFilter = "content_filter"
)

// turnUsage are the engine's token counts of the answer.
type turnUsage struct {
	known     bool
	input     int64
	output    int64
	cached    int64
	cachedOK  bool
	reasoning int64
}

// turn is one answer being built.
type turn struct {
	sink  turnSink
	began bool
	items []*turnItem
	cur   *turnItem
	// tools are the function calls by the engine's index for them.
	tools   map[int]*turnItem
	finish  string
	stopSeq string
	usage   turnUsage
	// ids makes a client item ID from a prefix and the item's position.
	ids func(prefix string, index int) string
	// outputs counts the pieces of output (text, reasoning, arguments).
	outputs int64
}

// begin starts the answer: the client's stream opens at the engine's
// first event, not before.
func (t *turn) begin() {
	if t.began {
		return
	}
	t.began = true
	if t.sink != nil {
		t.sink.begin()
	}
}

func (t *turn) newItem(k itemKind, prefix string) *turnItem {
	t.begin()
	t.closeCur()
	it := &turnItem{kind: k, index: len(t.items)}
	if t.ids != nil {
		it.id = t.ids(prefix, it.index)
	}
	return it
}

func (t *turn) openItem(it *turnItem) {
	t.items = append(t.items, it)
	t.cur = it
	if t.sink != nil {
		t.sink.open(it)
	}
}

// closeCur closes the open item.
func (t *turn) closeCur() {
	if t.cur == nil {
		return
	}
	it := t.cur
	t.cur = nil
	it.closed = true
	if t.sink != nil {
		t.sink.close(it)
	}
}

// text adds a piece of text for the user.
func (t *turn) text(s string) {
	t.piece(itemText, "msg_", s)
}

// reasoning adds a piece of the model's reasoning.
func (t *turn) reasoning(s string) {
	t.piece(itemReasoning, "rs_", s)
}

func (t *turn) piece(k itemKind, prefix, s string) {
	if s == "" {
		return
	}
	if t.cur == nil || t.cur.kind != k {
		t.openItem(t.newItem(k, prefix))
	}
	t.cur.text.WriteString(s)
	t.outputs++
	if t.sink != nil {
		t.sink.delta(t.cur, s)
	}
}

// toolStart opens function call idx (the engine's index) with its ID and
// name; a call opened again (an engine that repeats them) keeps its own.
func (t *turn) toolStart(idx int, id, name string) {
	if it := t.tools[idx]; it != nil {
		if it.name == "" {
			it.name = name
		}
		return
	}
	it := t.newItem(itemTool, "fc_")
	it.callID, it.name = id, name
	if it.callID == "" {
		it.callID = "call_" + strconv.Itoa(it.index) + randomHex(12)
	}
	if t.tools == nil {
		t.tools = map[int]*turnItem{}
	}
	t.tools[idx] = it
	t.openItem(it)
}

// toolArgs adds a piece of function call idx's arguments. A piece for a
// call already closed (an engine that interleaves parallel calls) is kept
// in the answer but no longer streamed.
func (t *turn) toolArgs(idx int, s string) {
	if s == "" {
		return
	}
	it := t.tools[idx]
	if it == nil {
		t.toolStart(idx, "", "")
		it = t.tools[idx]
	}
	it.args.WriteString(s)
	t.outputs++
	if t.sink != nil && !it.closed && t.cur == it {
		t.sink.delta(it, s)
	}
}

// end closes the answer's last item.
func (t *turn) end() {
	t.begin()
	t.closeCur()
}

// setFinish records why the engine ended the answer (chat completion's
// finish reasons).
func (t *turn) setFinish(reason string) {
	if reason != "" {
		t.finish = reason
	}
}

// hasTools reports whether the answer calls a function.
func (t *turn) hasTools() bool { return len(t.tools) > 0 }

// argsJSON is a call's arguments as a JSON object for a client that takes
// one (Messages' tool_use input): the model's text when it is an object,
// {} when empty, else the text kept whole under "_raw_arguments" (a model
// that wrote broken JSON).
func argsJSON(s string) json.RawMessage {
	s = strings.TrimSpace(s)
	if s == "" {
		return json.RawMessage(`{}`)
	}
	if s[0] == '{' && json.Valid([]byte(s)) {
		return json.RawMessage(s)
	}
	b, _ := json.Marshal(map[string]string{"_raw_arguments": s})
	return b
}
