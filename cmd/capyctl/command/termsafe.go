// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package command

import (
	"fmt"
	"io"
	"unicode/utf8"
)

// What the CLI prints comes in part from machines it does not trust: a
// host names itself, its instances, its engines and its GPUs, writes the
// messages of its events and errors, and a compromised one can put
// terminal escape sequences there (move the cursor, rewrite the lines
// above, retitle the window, hide text). Every byte the CLI writes goes
// through termSafe (RunWith installs it on Out and Err): control
// characters other than newline and tab, DEL, the C1 controls and the
// Unicode bidirectional overrides are written escaped (\x1b, \u009b,
// \u202e), and bytes that are not UTF-8 as \xNN. JSON output stays valid
// and means the same: encoding/json escapes C0 itself, and a \uXXXX
// escape inside a string is the same character.

// termSafe escapes what a terminal would act on.
type termSafe struct{ w io.Writer }

// safeOutput wraps w unless it is wrapped already.
func safeOutput(w io.Writer) io.Writer {
	if w == nil {
		return nil
	}
	if _, ok := w.(termSafe); ok {
		return w
	}
	return termSafe{w}
}

// rawOutput is the writer under termSafe: for the escape sequences the CLI
// writes itself (a progress bar's \r and erase-line).
func rawOutput(w io.Writer) io.Writer {
	if s, ok := w.(termSafe); ok {
		return s.w
	}
	return w
}

// Write implements io.Writer.
func (s termSafe) Write(p []byte) (int, error) {
	if _, err := s.w.Write(escapeTerminal(p)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// escapeTerminal returns p with what a terminal acts on escaped (p itself
// when there is nothing to escape).
func escapeTerminal(p []byte) []byte {
	clean := true
	for _, b := range p {
		if (b < 0x20 && b != '\n' && b != '\t') || b >= 0x7f {
			clean = false
			break
		}
	}
	if clean {
		return p
	}
	out := make([]byte, 0, len(p)+16)
	for i := 0; i < len(p); {
		r, n := utf8.DecodeRune(p[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			out = fmt.Appendf(out, `\x%02x`, p[i])
		case r == '\n' || r == '\t':
			out = append(out, byte(r))
		case r < 0x20 || r == 0x7f:
			out = fmt.Appendf(out, `\x%02x`, r)
		case (r >= 0x80 && r <= 0x9f) || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069) || r == 0x200e || r == 0x200f:
			out = fmt.Appendf(out, `\u%04x`, r)
		default:
			out = append(out, p[i:i+n]...)
		}
		i += n
	}
	return out
}
