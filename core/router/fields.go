// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// The router reads a request's fields the way the engines do: by their exact
// names. IMPORTANT: encoding/json matches struct fields without regard to
// case, so {"MODEL":"demo"} would route to demo while a Python engine
// (pydantic, case-sensitive) sees no model; and {"Stream":true} would make
// the router stream an answer the engine was told nothing about. Never
// decode a request body into a struct; read its members with eachMember.

// errNotObject is the refusal of a body that is valid JSON but no object.
var errNotObject = errors.New("the body is not a JSON object")

// eachMember calls fn with every member of the JSON object in body, in
// order, with the member's name unescaped and its value as written (a
// sub-slice of body: nothing is copied). It fails when body is not valid
// JSON or not an object. A name written twice is passed twice: the last one
// wins where fn assigns, as in Python's json module.
func eachMember(body []byte, fn func(name string, value []byte) error) error {
	if !json.Valid(body) {
		// The decoder's message says where the body stops being JSON.
		var v any
		err := json.Unmarshal(body, &v)
		if err == nil {
			err = errors.New("invalid JSON")
		}
		return err
	}
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return errNotObject
	}
	i = skipSpace(body, i+1)
	if body[i] == '}' {
		return nil
	}
	for {
		// body is valid JSON: a member is "name" ws : ws value ws [,}]
		end := skipString(body, i)
		rawName := body[i:end]
		name := string(rawName[1 : len(rawName)-1])
		if bytes.IndexByte(rawName, '\\') >= 0 {
			if err := json.Unmarshal(rawName, &name); err != nil {
				return err
			}
		}
		i = skipSpace(body, end)
		i = skipSpace(body, i+1) // the colon
		vend := skipValue(body, i)
		if err := fn(name, body[i:vend]); err != nil {
			return err
		}
		i = skipSpace(body, vend)
		if body[i] == '}' {
			return nil
		}
		i = skipSpace(body, i+1) // the comma
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// skipString returns the index after the string that starts at b[i] (a
// quote), in valid JSON.
func skipString(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return len(b)
}

// skipValue returns the index after the value that starts at b[i], in valid
// JSON.
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				j = skipString(b, j) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return len(b)
	default: // a number, true, false or null
		j := i
		for j < len(b) {
			switch b[j] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return j
			}
			j++
		}
		return j
	}
}

// errAmbiguousModel is the refusal of a body that names its model twice,
// or with a member whose name is "model" in other letters ("Model"):
// whoever reads the body another way (encoding/json matches names without
// regard to case and keeps the last) would take another model than the
// router, and a server's placement would not be what its host serves.
var errAmbiguousModel = errors.New("ambiguous model")

// oneModel checks a member's name against the model members seen so far.
func oneModel(name string, seen *bool) error {
	switch {
	case name == "model" && *seen:
		return fmt.Errorf("%w: the body names \"model\" twice", errAmbiguousModel)
	case name == "model":
		*seen = true
	case len(name) == len("model") && strings.EqualFold(name, "model"):
		return fmt.Errorf("%w: the body has a member %q: member names are case-sensitive, send \"model\" once", errAmbiguousModel, name)
	}
	return nil
}

// peekModel returns the body's "model" member, by its exact name; a body
// that names it twice or in other letters is refused (errAmbiguousModel).
func peekModel(body []byte) (string, error) {
	var model string
	seen := false
	err := eachMember(body, func(name string, v []byte) error {
		if err := oneModel(name, &seen); err != nil {
			return err
		}
		if name != "model" {
			return nil
		}
		if err := json.Unmarshal(v, &model); err != nil {
			return fmt.Errorf("model: %w", err)
		}
		return nil
	})
	return model, err
}

// RequestModel returns the model an inference request's body names, read
// as the router reads it: the member "model" by its exact name, a body
// that names it twice or in other letters refused. The server role's
// relay places a request with it, so the server and the host that serves
// the request agree on the model.
func RequestModel(body []byte) (string, error) {
	m, err := peekModel(body)
	if err != nil && !errors.Is(err, errAmbiguousModel) {
		err = fmt.Errorf("the request body is not a JSON object: %w", err)
	}
	return m, err
}

// hasMember reports whether body, a JSON object, has a top-level member
// name whose value is not null.
func hasMember(body []byte, name string) bool {
	found := false
	_ = eachMember(body, func(n string, v []byte) error {
		if n == name && string(v) != "null" {
			found = true
		}
		return nil
	})
	return found
}

// parseChatHead reads the members of a chat body the router needs, by their
// exact names. A member of the wrong type is an error, after the model was
// read when it is a string (api_mismatch is decided from the model alone).
func parseChatHead(body []byte, head *chatHead) error {
	var typeErr error
	seen := false
	err := eachMember(body, func(name string, v []byte) error {
		if err := oneModel(name, &seen); err != nil {
			return err
		}
		var err error
		switch name {
		case "model":
			head.Model = ""
			err = json.Unmarshal(v, &head.Model)
		case "stream":
			head.Stream = false
			err = json.Unmarshal(v, &head.Stream)
		case "stream_options":
			head.StreamOptions = nil
			if string(v) != "null" {
				head.StreamOptions = &streamOptions{}
				err = eachMember(v, func(name string, v []byte) error {
					if name != "include_usage" {
						return nil
					}
					head.StreamOptions.IncludeUsage = false
					return json.Unmarshal(v, &head.StreamOptions.IncludeUsage)
				})
				if err == errNotObject {
					err = errors.New("not an object")
				}
			}
		case "messages":
			err = head.Messages.UnmarshalJSON(v)
		case "n":
			head.N = nil
			err = json.Unmarshal(v, &head.N)
		case "functions":
			head.Functions = json.RawMessage(v)
		case "cache_salt":
			head.CacheSalt = nil
			if string(v) != "null" {
				var salt string
				err = json.Unmarshal(v, &salt)
				head.CacheSalt = &salt
			}
		default:
			return nil
		}
		if err != nil && typeErr == nil {
			typeErr = fmt.Errorf("%s: %w", name, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return typeErr
}
