// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
)

// dialClient is an HTTP/1.1 client whose connections are TLS with cfg,
// handed to net/http as plain connections (its URLs are http://ADDR/...).
func dialClient(cfg *tls.Config) *http.Client {
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: cfg}
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return plainConn{c}, nil
		},
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     time.Minute,
	}}
}

// postJSON posts body and decodes a 2xx answer into out (nil: none); an
// error answer comes back as its catalogue error, a failed connection as
// unavailable (retryable).
func postJSON(ctx context.Context, c *http.Client, addr, path string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	return doJSON(c, addr, req, out)
}

func getJSON(ctx context.Context, c *http.Client, addr, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return err
	}
	return doJSON(c, addr, req, out)
}

func doJSON(c *http.Client, addr string, req *http.Request, out any) error {
	resp, err := c.Do(req)
	if err != nil {
		e := structs.AsError(err)
		if e.Code == structs.CodeJoinCAMismatch {
			return e
		}
		return structs.Wrap(structs.CodeUnavailable, err, "server %s", addr).WithDetail("server", addr)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return structs.Wrap(structs.CodeUnavailable, err, "read server %s's answer", addr)
	}
	if resp.StatusCode/100 != 2 {
		var env wire.ErrorEnvelope
		if json.Unmarshal(data, &env) == nil && env.Error.Code != "" {
			e := structs.Errf(structs.Code(env.Error.Code), "server %s: %s", addr, env.Error.Message)
			for k, v := range env.Error.Details {
				e = e.WithDetail(k, v)
			}
			return e
		}
		return structs.Errf(structs.CodeInternal, "server %s answered %d", addr, resp.StatusCode)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return structs.Wrap(structs.CodeInternal, err, "server %s's answer", addr)
		}
	}
	return nil
}
