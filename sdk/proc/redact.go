// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package proc

import (
	"bytes"
	"io"
	"regexp"
	"sort"
	"strings"
	"sync"
)

// Redacted replaces every secret the Redactor finds.
const Redacted = "<redacted>"

// minRunBytes is the shortest run that may be a bare credential.
const minRunBytes = 40

// MaxLineBytes caps a line in the redacting writer: a longer run without a
// line break is cut (at a space where one is near the end) and redacted in
// pieces.
const MaxLineBytes = 64 << 10

var (
	// urlCredRe: scheme://user:pass@ → scheme://<redacted>@.
	urlCredRe = regexp.MustCompile(`(?i)\b([a-z][a-z0-9+.\-]*://)[^\s/?#@:'"]*:[^\s/?#@'"]*@`)
	// queryRe: a sensitive query parameter's value.
	queryRe = regexp.MustCompile(`(?i)([?&;](?:access_token|refresh_token|id_token|token|api[_-]?key|apikey|key|password|passwd|pwd|secret|client_secret|sig|signature|x-amz-signature|x-amz-credential|x-amz-security-token|auth)=)[^&#\s"'<>]+`)
	// authHeaderRe: an Authorization header's credentials, whatever the scheme.
	authHeaderRe = regexp.MustCompile(`(?i)(\bauthorization["']?\s*[:=]\s*["']?(?:(?:bearer|basic|token|digest)\s+)?)[^\s"',;<>]+`)
	// bearerRe: "Bearer <token>" anywhere.
	bearerRe = regexp.MustCompile(`(?i)\b(bearer\s+)[A-Za-z0-9._~+/=\-]+`)
	// prefixedTokenRe: tokens with well-known prefixes (Hugging Face, OpenAI,
	// GitHub, Slack).
	prefixedTokenRe = regexp.MustCompile(`hf_[A-Za-z0-9]{20,}|\bsk-[A-Za-z0-9_\-]{20,}|\bgh[pousr]_[A-Za-z0-9]{20,}|\bgithub_pat_[A-Za-z0-9_]{20,}|\bxox[abprs]-[A-Za-z0-9\-]{10,}`)
	// tokenPrefixes gate prefixedTokenRe (lower case).
	tokenPrefixes = []string{"hf_", "sk-", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "xox"}
	// numberRe: a plain number (counts such as max_tokens=2048 stay).
	numberRe = regexp.MustCompile(`^[+-]?[0-9]{1,15}(\.[0-9]+)?$`)
)

// Redactor removes secrets from log lines. It replaces with "<redacted>":
//   - the exact secret values it was built with;
//   - "Bearer <token>" and Authorization header values;
//   - Hugging Face tokens (hf_...) and other well-known token prefixes
//     (sk-, ghp_, github_pat_, xox?-);
//   - URL credentials (scheme://user:pass@) and sensitive query parameters
//     (token=, key=, api_key=, password=, secret=, signatures);
//   - values of assignments whose name looks secret (api_key, token,
//     secret, password, passwd, credential, with = or :), and of options
//     such as "--api-key VALUE"; plain numbers are kept for token and key
//     names (max_tokens=2048 is a count, not a credential);
//   - long credential-like runs: at least 40 characters of
//     [A-Za-z0-9_-+/=] with letters and digits that change character class
//     often, as random keys, hex digests and base64 do. Paths and
//     identifiers (long, but made of words) are kept.
//
// A Redactor is safe for concurrent use.
type Redactor struct {
	secrets [][]byte
}

// NewRedactor returns a Redactor for the exact secrets (empty values are
// ignored) and the built-in patterns.
func NewRedactor(secrets []string) *Redactor {
	r := &Redactor{}
	seen := map[string]bool{}
	for _, s := range secrets {
		if s == "" || seen[s] {
			continue
		}
		seen[s] = true
		r.secrets = append(r.secrets, []byte(s))
	}
	// Longest first, so a secret containing another is replaced whole.
	sort.Slice(r.secrets, func(i, j int) bool { return len(r.secrets[i]) > len(r.secrets[j]) })
	return r
}

// RedactString is Redact for a string.
func (r *Redactor) RedactString(s string) string {
	return string(r.Redact([]byte(s)))
}

// Redact returns line with every secret replaced. It works on one line (or
// a piece of one); the result may share memory with line when nothing was
// replaced.
func (r *Redactor) Redact(line []byte) []byte {
	out := line
	if r != nil {
		for _, s := range r.secrets {
			if bytes.Contains(out, s) {
				out = bytes.ReplaceAll(out, s, []byte(Redacted))
			}
		}
	}
	// Cheap checks keep the regular expressions off the ordinary line.
	lower := asciiLower(out)
	has := func(s string) bool { return bytes.Contains(lower, []byte(s)) }
	if has("://") && bytes.IndexByte(out, '@') >= 0 {
		out = urlCredRe.ReplaceAll(out, []byte("${1}"+Redacted+"@"))
	}
	if bytes.IndexByte(out, '=') >= 0 && bytes.ContainsAny(out, "?&;") {
		out = queryRe.ReplaceAll(out, []byte("${1}"+Redacted))
	}
	if has("authorization") {
		out = authHeaderRe.ReplaceAll(out, []byte("${1}"+Redacted))
	}
	if has("bearer") {
		out = bearerRe.ReplaceAll(out, []byte("${1}"+Redacted))
	}
	for _, p := range tokenPrefixes {
		if has(p) {
			out = prefixedTokenRe.ReplaceAll(out, []byte(Redacted))
			break
		}
	}
	out = redactNamedValues(out)
	return redactLongRuns(out)
}

// secretWords are the names whose values are secrets: in assignments
// (NAME=VALUE, NAME: VALUE, "NAME": "VALUE") and options (--NAME VALUE).
// A trailing "s" is allowed (tokens, credentials).
var secretWords = []string{"api_key", "api-key", "apikey", "token", "secret", "password", "passwd", "credential"}

// span is a replacement of b[from:to].
type span struct {
	from, to int
	with     string
}

// redactNamedValues replaces the values of assignments and options whose
// name contains a secret word.
func redactNamedValues(b []byte) []byte {
	lower := asciiLower(b)
	var spans []span
	for _, w := range secretWords {
		for off := 0; ; {
			i := bytes.Index(lower[off:], []byte(w))
			if i < 0 {
				break
			}
			i += off
			off = i + len(w)
			if sp, ok := namedValue(b, i, w); ok {
				spans = append(spans, sp)
			}
		}
	}
	if len(spans) == 0 {
		return b
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].from < spans[j].from })
	var out []byte
	last := 0
	for _, sp := range spans {
		if sp.from < last {
			continue // overlaps one already replaced
		}
		out = append(out, b[last:sp.from]...)
		out = append(out, sp.with...)
		last = sp.to
	}
	return append(out, b[last:]...)
}

// namedValue looks at the secret word w found at b[i:] and returns the
// value to replace, if it is followed by one.
func namedValue(b []byte, i int, w string) (span, bool) {
	j := i + len(w)
	if j < len(b) && (b[j] == 's' || b[j] == 'S') {
		j++
	}
	// NAME=VALUE, NAME: VALUE, "NAME": VALUE.
	k := j
	if k < len(b) && (b[k] == '"' || b[k] == '\'') {
		k++
	}
	k = skipBlanks(b, k)
	if k < len(b) && (b[k] == '=' || b[k] == ':') && !bytes.HasPrefix(b[k:], []byte("://")) {
		return valueSpan(b, skipBlanks(b, k+1), w)
	}
	// --NAME VALUE: the word is part of an option that starts a word.
	s := i
	for s > 0 && isNameByte(b[s-1]) {
		s--
	}
	if !bytes.HasPrefix(b[s:], []byte("--")) || (s > 0 && !bytes.ContainsRune([]byte(" \t\"'=,[("), rune(b[s-1]))) {
		return span{}, false
	}
	if j >= len(b) || (b[j] != ' ' && b[j] != '\t') {
		return span{}, false
	}
	k = skipBlanks(b, j)
	if bytes.HasPrefix(b[k:], []byte("--")) {
		return span{}, false // the next word is another option
	}
	e := k
	for e < len(b) && !isSpace(b[e]) {
		e++
	}
	if e == k || keepValue(w, string(b[k:e])) {
		return span{}, false
	}
	return span{from: k, to: e, with: Redacted}, true
}

// valueSpan returns the value starting at b[k]: quoted, a bracketed list,
// or a bare word.
func valueSpan(b []byte, k int, w string) (span, bool) {
	if k >= len(b) {
		return span{}, false
	}
	var e int
	with := Redacted
	switch c := b[k]; c {
	case '"', '\'':
		n := bytes.IndexByte(b[k+1:], c)
		if n < 0 {
			return span{}, false
		}
		e = k + 1 + n + 1
		with = string(c) + Redacted + string(c)
	case '[':
		n := bytes.IndexByte(b[k+1:], ']')
		if n < 0 {
			return span{}, false
		}
		e = k + 1 + n + 1
		with = "[" + Redacted + "]"
	default:
		e = k
		for e < len(b) && !isSpace(b[e]) && !bytes.ContainsRune([]byte(`"',;)}]`), rune(b[e])) {
			e++
		}
	}
	if e == k || keepValue(w, string(b[k:e])) {
		return span{}, false
	}
	return span{from: k, to: e, with: with}, true
}

// skipBlanks returns the index of the first byte at or after k that is not
// a space or a tab.
func skipBlanks(b []byte, k int) int {
	for k < len(b) && (b[k] == ' ' || b[k] == '\t') {
		k++
	}
	return k
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}

func isNameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// asciiLower lowers ASCII letters only, so that offsets in the result are
// offsets in b (bytes.ToLower may change the length of invalid UTF-8).
func asciiLower(b []byte) []byte {
	out := make([]byte, len(b))
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		out[i] = c
	}
	return out
}

// isRunByte reports whether c belongs to a credential-like run.
func isRunByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '_' || c == '-' || c == '+' || c == '/' || c == '='
}

// redactLongRuns replaces runs of at least 40 bytes of [A-Za-z0-9_-+/=]
// that look like credentials.
func redactLongRuns(b []byte) []byte {
	var out []byte // nil until something is replaced
	last, start := 0, -1
	for i := 0; i <= len(b); i++ {
		if i < len(b) && isRunByte(b[i]) {
			if start < 0 {
				start = i
			}
			continue
		}
		if start >= 0 && i-start >= minRunBytes && credentialLike(b[start:i]) {
			out = append(out, b[last:start]...)
			out = append(out, narrowRun(b[start:i])...)
			last = i
		}
		start = -1
	}
	if out == nil {
		return b
	}
	return append(out, b[last:]...)
}

// keepValue reports whether an assignment's value is no secret: a count for
// a token or key name, or an empty/none value.
func keepValue(name, value string) bool {
	v := strings.Trim(value, `"'[] `)
	switch strings.ToLower(v) {
	case "", "none", "null", "nil", "true", "false":
		return true
	}
	if strings.HasPrefix(v, Redacted) {
		return true // already redacted by an earlier rule
	}
	n := strings.ToLower(name)
	if strings.Contains(n, "token") || strings.Contains(n, "key") {
		return numberRe.MatchString(v)
	}
	return false
}

// narrowRun returns the replacement of a credential-like run. In a path or
// URL ("org/model/resolve/<40 hex>/config") only the '/'-separated parts
// that are credential-like themselves (20 bytes or more) go; when none is,
// the whole run goes, since base64 holds '/' too.
func narrowRun(run []byte) []byte {
	if bytes.IndexByte(run, '/') < 0 {
		return []byte(Redacted)
	}
	parts := bytes.Split(run, []byte("/"))
	narrowed := false
	for i, p := range parts {
		if len(p) >= 20 && credentialLike(p) {
			parts[i] = []byte(Redacted)
			narrowed = true
		}
	}
	if !narrowed {
		return []byte(Redacted)
	}
	return bytes.Join(parts, []byte("/"))
}

// credentialLike reports whether a long run looks like a random credential:
// letters and digits, with the character class (upper, lower, digit)
// changing between neighbours often. Random base64 changes class about two
// times in three, hex about one in two; words, paths and identifiers rarely.
func credentialLike(run []byte) bool {
	var letters, digits, pairs, changes int
	prev := 0 // 0: not alphanumeric, 1: upper, 2: lower, 3: digit
	for _, c := range run {
		cls := 0
		switch {
		case c >= 'A' && c <= 'Z':
			cls = 1
			letters++
		case c >= 'a' && c <= 'z':
			cls = 2
			letters++
		case c >= '0' && c <= '9':
			cls = 3
			digits++
		}
		if cls != 0 && prev != 0 {
			pairs++
			if cls != prev {
				changes++
			}
		}
		prev = cls
	}
	if letters == 0 || digits == 0 || pairs == 0 {
		return false
	}
	return changes*4 >= pairs // a change rate of at least 25%
}

// redactingWriter buffers to line boundaries and writes redacted lines.
type redactingWriter struct {
	mu     sync.Mutex
	w      io.Writer
	r      *Redactor
	buf    []byte
	out    []byte // redacted lines not yet written
	closed bool
}

// NewRedactingWriter returns a writer that redacts what it is given line by
// line with r and writes the result to w. It buffers until a line ends
// ('\n', or '\r' as progress bars use), caps a line at MaxLineBytes, and
// writes a final partial line on Close. Close does not close w. It is safe
// for concurrent use.
func NewRedactingWriter(w io.Writer, r *Redactor) io.WriteCloser {
	return &redactingWriter{w: w, r: r}
}

// Write implements io.Writer. It reports len(p) unless w fails.
func (rw *redactingWriter) Write(p []byte) (int, error) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if rw.closed {
		return 0, io.ErrClosedPipe
	}
	rw.buf = append(rw.buf, p...)
	var firstErr error
	// The redacted lines go out together, one write for what this write
	// completed (an engine's log file and ring are written once per read
	// of its output, not once per line), in pieces of at most
	// MaxLineBytes: the log file rotates between writes.
	out := rw.out[:0]
	flush := func() {
		if len(out) == 0 {
			return
		}
		if _, err := rw.w.Write(out); err != nil && firstErr == nil {
			firstErr = err
		}
		out = out[:0]
	}
	rest := rw.buf
	for len(rest) > 0 {
		i := bytes.IndexAny(rest, "\n\r")
		n := 0
		switch {
		case i >= 0 && i < MaxLineBytes:
			n = i + 1
			if rest[i] == '\r' && n < len(rest) && rest[n] == '\n' {
				n++
			}
		case len(rest) >= MaxLineBytes:
			n = cutPoint(rest[:MaxLineBytes])
		}
		if n == 0 {
			break
		}
		line := rw.r.Redact(rest[:n])
		if len(out)+len(line) > MaxLineBytes {
			flush()
		}
		out = append(out, line...)
		rest = rest[n:]
	}
	flush()
	if cap(out) <= 4*MaxLineBytes {
		rw.out = out
	}
	// Move the partial line to the front; drop a buffer grown by one huge
	// write.
	k := copy(rw.buf, rest)
	rw.buf = rw.buf[:k]
	if cap(rw.buf) > 4*MaxLineBytes {
		rw.buf = append([]byte(nil), rw.buf...)
	}
	return len(p), firstErr
}

// cutPoint chooses where to cut an over-long line: after the last blank in
// its second half, so that a secret is not split in two, else at the end.
func cutPoint(b []byte) int {
	if i := bytes.LastIndexAny(b, " \t"); i >= len(b)/2 {
		return i + 1
	}
	return len(b)
}

// Close writes the partial last line, if any.
func (rw *redactingWriter) Close() error {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if rw.closed {
		return nil
	}
	rw.closed = true
	if len(rw.buf) == 0 {
		return nil
	}
	_, err := rw.w.Write(rw.r.Redact(rw.buf))
	rw.buf = nil
	return err
}
