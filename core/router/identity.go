// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

import "context"

// Caller is who sent a request, as the inference API's authentication
// found it. The router keys what a client stores (the Responses API's
// stored responses) by it, so that one key never reads another's.
type Caller struct {
	// Key is the identity of the API key the request carried: its name.
	// Today a role has one API key, named DefaultKeyName; named keys
	// (several per role) put their own names here and change nothing
	// else.
	Key string
}

// DefaultKeyName is the name of a role's one API key.
const DefaultKeyName = "default"

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
