// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import (
	"context"

	"github.com/capyctl/capyctl/core/structs"
)

// Caller is who sent a request, as the inference API's authentication
// found it. The router keys what a client stores (the Responses API's
// stored responses) by it, so that one key never reads another's; answers
// only for the models its scope allows, as if no other existed; and
// settles the request's share of its key's limits and usage through its
// meter.
type Caller struct {
	// Key is the identity of the API key the request carried: its name
	// (the role's own key is DefaultKeyName).
	Key string
	// Weight is the key's share of a contended model's places (0: 1).
	Weight int
	// Scope is the models the key may use (nil: every model).
	Scope Scope
	// Meter, when set, is taken by a request the router serves and
	// settled once that request ends (after its stream, for a stream).
	Meter Meter
}

// Scope says which models a key may use.
type Scope interface {
	Allows(model string) bool
}

// Meter is one request's share of its key's limits and usage
// (core/apikeys' Ticket).
type Meter interface {
	// Take says the router serves the request: it calls Settle when the
	// request ends.
	Take()
	// Settle ends the request with what it used.
	Settle(u structs.RequestUsage)
}

// Allows reports whether the caller may use model.
func (c Caller) Allows(model string) bool { return c.Scope == nil || c.Scope.Allows(model) }

// Headers a server sets on the requests it relays to a host: the name and
// weight of the key the client's request carried (a host's relay reads
// them, and only there: the server's mutual TLS vouches for them).
const (
	HeaderKeyName   = "X-CapyCTL-Relayed-Key"
	HeaderKeyWeight = "X-CapyCTL-Relayed-Key-Weight"
)

type relayedKeyKey struct{}

type relayedKey struct {
	name   string
	weight int
}

// WithRelayedKey returns ctx carrying the key a server relayed the
// request for: the host's authentication (which checks the host's own
// key, the relay's) names the request after it.
func WithRelayedKey(ctx context.Context, name string, weight int) context.Context {
	return context.WithValue(ctx, relayedKeyKey{}, relayedKey{name: name, weight: weight})
}

// RelayedKeyOf returns the key a server relayed the request for.
func RelayedKeyOf(ctx context.Context) (name string, weight int, ok bool) {
	k, ok := ctx.Value(relayedKeyKey{}).(relayedKey)
	return k.name, k.weight, ok && k.name != ""
}

// DefaultKeyName is the name of a role's own API key.
const DefaultKeyName = structs.DefaultKeyName

type callerKey struct{}

// WithCaller returns ctx carrying the request's caller (the inference
// API's authentication sets it).
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerOf returns the caller ctx carries; without one (a router used
// without the API's authentication, as in tests) the default key.
func CallerOf(ctx context.Context) Caller {
	if c, ok := ctx.Value(callerKey{}).(Caller); ok && c.Key != "" {
		return c
	}
	return Caller{Key: DefaultKeyName}
}

type relayKey struct{}

// WithRelayed marks ctx as a request a server relayed to this host over
// the host link: its Responses request may carry the server's "capyctl"
// member (RelayedResponse), which a client's never may.
func WithRelayed(ctx context.Context) context.Context {
	return context.WithValue(ctx, relayKey{}, true)
}

// relayed reports a request a server relayed (WithRelayed).
func relayed(ctx context.Context) bool {
	v, _ := ctx.Value(relayKey{}).(bool)
	return v
}
