// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package dashboard

import (
	"errors"
	"net/http"
	"strings"

	"github.com/capyctl/capyctl/core/api/wire"
	"github.com/capyctl/capyctl/core/structs"
)

// The playground: the page sends a chat request to a model and shows the
// streamed answer, its request ID and its per-answer metrics. The page
// lives on the management listener and its policy lets it call nothing
// but its own origin, so its requests come here, with the admin session,
// and are handed to the role's own inference API in this process (the
// same handler the inference listener serves: the same key check, router,
// admission and request ledger as any client's request). The inference
// key is the operator's choice: one of the keys the role names (Key; the
// role's one API key today, "default"), or one pasted into the page and
// sent as it is (the inference API checks it, so a wrong one is 401).
//
//	GET  /dashboard/playground/keys                  the keys by name (never their secrets)
//	POST /dashboard/playground/v1/chat/completions   a chat request, the answer as the inference API sends it
const (
	// HeaderKeyName names the key a playground request uses (a Key's
	// Name).
	HeaderKeyName = "X-CapyCTL-Key-Name"
	// HeaderKey carries a key the operator pasted into the page instead.
	HeaderKey = "X-CapyCTL-Key"
	// playgroundPrefix is the playground's path under Prefix.
	playgroundPrefix = "/playground"
)

// playgroundRoutes are the inference API's routes the playground may call.
var playgroundRoutes = map[string]string{
	"/v1/chat/completions": http.MethodPost,
}

// Key is an inference API key the playground may use by name.
type Key struct {
	// Name is what the page shows and sends ("default").
	Name string `json:"name"`
	// Description says what the key is, for the page.
	Description string `json:"description"`
	// Secret is the key itself; it never leaves the role.
	Secret string `json:"-"`
}

// playgroundKeys answers GET /dashboard/playground/keys.
type playgroundKeys struct {
	APIVersion string `json:"api_version"`
	Keys       []Key  `json:"keys"`
}

// playground serves the playground's routes (rest is the path after the
// playground's prefix). Every call needs the session, as the management
// API's do.
func (d *Dashboard) playground(w http.ResponseWriter, r *http.Request, rest string) {
	if err := d.Authorize(r); err != nil {
		if errors.Is(err, ErrNoSession) {
			err = structs.Errf(structs.CodeUnauthorized, "not logged in: post the admin token to %slogin", Prefix)
		}
		writeError(w, err)
		return
	}
	if d.o.Inference == nil {
		writeError(w, structs.Errf(structs.CodeUnsupported, "this role serves no inference API to try models on"))
		return
	}
	if rest == "/keys" {
		if r.Method != http.MethodGet {
			writeError(w, structs.Errf(structs.CodeMethodNotAllowed, "%s is not allowed on %s", r.Method, r.URL.Path))
			return
		}
		writeJSON(w, http.StatusOK, playgroundKeys{APIVersion: wire.APIVersion, Keys: d.keys()})
		return
	}
	method, ok := playgroundRoutes[rest]
	if !ok {
		writeError(w, structs.Errf(structs.CodeNotFound, "the playground has no route %s", r.URL.Path))
		return
	}
	if r.Method != method {
		writeError(w, structs.Errf(structs.CodeMethodNotAllowed, "%s is not allowed on %s", r.Method, r.URL.Path))
		return
	}
	key, err := d.playgroundKey(r)
	if err != nil {
		writeError(w, err)
		return
	}
	// The inference API sees a client's request: its own path, the key
	// chosen, and none of the session's cookie and headers.
	in := r.Clone(r.Context())
	in.URL.Path, in.URL.RawPath, in.RequestURI = rest, "", ""
	for _, h := range []string{"Cookie", HeaderCSRF, HeaderKeyName, HeaderKey, "Origin", "Referer"} {
		in.Header.Del(h)
	}
	in.Header.Set("Authorization", "Bearer "+key)
	d.o.Inference.ServeHTTP(&streamWriter{w: w}, in)
}

// keys are the keys the playground offers by name.
func (d *Dashboard) keys() []Key {
	if d.o.Keys == nil {
		return []Key{}
	}
	return d.o.Keys()
}

// playgroundKey is the key a playground request chose: by name, or pasted.
func (d *Dashboard) playgroundKey(r *http.Request) (string, error) {
	if pasted := strings.TrimSpace(r.Header.Get(HeaderKey)); pasted != "" {
		return pasted, nil
	}
	name := r.Header.Get(HeaderKeyName)
	if name == "" {
		return "", structs.Errf(structs.CodeInvalidRequest, "choose the inference key: %s (a name from %s%s/keys) or %s", HeaderKeyName,
			strings.TrimSuffix(Prefix, "/"), playgroundPrefix, HeaderKey)
	}
	for _, k := range d.keys() {
		if k.Name == name {
			return k.Secret, nil
		}
	}
	return "", structs.Errf(structs.CodeNotFound, "no inference key named %q (%s%s/keys lists them)", name, strings.TrimSuffix(Prefix, "/"), playgroundPrefix)
}

// streamWriter hands the inference API's answer to the page: headers,
// status and body as written, flushed as the handler flushes (a stream
// arrives token by token). IMPORTANT: it offers no Hijack and no Unwrap,
// so the router keeps a playground stream on net/http instead of taking
// over the management listener's connection.
type streamWriter struct{ w http.ResponseWriter }

func (s *streamWriter) Header() http.Header         { return s.w.Header() }
func (s *streamWriter) Write(p []byte) (int, error) { return s.w.Write(p) }
func (s *streamWriter) WriteHeader(code int)        { s.w.WriteHeader(code) }

// Flush implements http.Flusher.
func (s *streamWriter) Flush() {
	if f, ok := s.w.(http.Flusher); ok {
		f.Flush()
	}
}
