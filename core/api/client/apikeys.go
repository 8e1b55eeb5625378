// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/capyctl/capyctl/core/api/wire"
)

// CreateAPIKey makes a named key of the inference API. The answer's Key is
// the secret, shown this once: the role keeps only its digest.
func (c *Client) CreateAPIKey(ctx context.Context, req wire.APIKeyCreateRequest) (*wire.APIKeyCreated, error) {
	var out wire.APIKeyCreated
	if err := c.do(ctx, http.MethodPost, "/api-keys", req, &out, nil); err != nil {
		return nil, err
	}
	return &out, nil
}

// APIKeys lists the named keys (never a secret).
func (c *Client) APIKeys(ctx context.Context) ([]wire.APIKey, error) {
	var out wire.APIKeyList
	if err := c.do(ctx, http.MethodGet, "/api-keys", nil, &out, nil); err != nil {
		return nil, err
	}
	return out.Keys, nil
}

// APIKey returns one named key.
func (c *Client) APIKey(ctx context.Context, name string) (*wire.APIKey, error) {
	var out wire.APIKey
	if err := c.do(ctx, http.MethodGet, "/api-keys/"+url.PathEscape(name), nil, &out, nil); err != nil {
		return nil, err
	}
	return &out, nil
}

// UpdateAPIKey changes a key's models, limits, weight or expiry (each
// field set replaces the key's) and returns the key after the change.
func (c *Client) UpdateAPIKey(ctx context.Context, name string, req wire.APIKeyUpdateRequest) (*wire.APIKey, error) {
	var out wire.APIKey
	if err := c.do(ctx, http.MethodPatch, "/api-keys/"+url.PathEscape(name), req, &out, nil); err != nil {
		return nil, err
	}
	return &out, nil
}

// RevokeAPIKey revokes a named key: its next request is answered 401.
func (c *Client) RevokeAPIKey(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/api-keys/"+url.PathEscape(name), nil, nil, nil)
}

// UsageQuery selects usage rows; empty fields select all. Since is a
// duration back from now ("24h") or an RFC 3339 time; empty: 24h.
type UsageQuery struct {
	Key, Model, Since string
}

// Usage returns the keys' usage per key, model and hour.
func (c *Client) Usage(ctx context.Context, q UsageQuery) (*wire.UsageResponse, error) {
	v := url.Values{}
	for k, s := range map[string]string{"key": q.Key, "model": q.Model, "since": q.Since} {
		if s != "" {
			v.Set(k, s)
		}
	}
	path := "/usage"
	if len(v) > 0 {
		path += "?" + v.Encode()
	}
	var out wire.UsageResponse
	if err := c.do(ctx, http.MethodGet, path, nil, &out, nil); err != nil {
		return nil, err
	}
	return &out, nil
}
