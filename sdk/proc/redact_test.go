// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package proc

import (
	"bytes"
	"strings"
	"testing"
)

func TestRedactor_Redact(t *testing.T) {
	r := NewRedactor([]string{"engine-key-123", "", "x9"})
	cases := []struct {
		name string
		in   string
		want string
	}{
		// Secrets go.
		{name: "exact secret", in: "key engine-key-123 used", want: "key <redacted> used"},
		{name: "short exact secret", in: "a x9 b", want: "a <redacted> b"},
		{name: "bearer", in: "sent Bearer abc.def-ghi_123 to engine", want: "sent Bearer <redacted> to engine"},
		{name: "authorization header", in: `"Authorization": "Basic dXNlcjpwYXNz"`, want: `"Authorization": "Basic <redacted>"`},
		{name: "hugging face token", in: "using hf_AbCdEfGhIjKlMnOpQrStUv", want: "using <redacted>"},
		{name: "openai key", in: "OPENAI sk-proj-abcdefghijklmnopqrstuvwx", want: "OPENAI <redacted>"},
		{name: "github token", in: "ghp_abcdefghijklmnopqrstuvwxyz012345", want: "<redacted>"},
		{name: "url credentials", in: "fetch https://user:p4ss@host.example/repo.git", want: "fetch https://<redacted>@host.example/repo.git"},
		{name: "redis url", in: "redis://:secretpw@127.0.0.1:6379/0", want: "redis://<redacted>@127.0.0.1:6379/0"},
		{name: "query token", in: "GET /x?a=1&token=abc123&b=2", want: "GET /x?a=1&token=<redacted>&b=2"},
		{name: "query key", in: "https://h/p?key=zzz", want: "https://h/p?key=<redacted>"},
		{name: "query api_key", in: "https://h/p?api_key=zzz#f", want: "https://h/p?api_key=<redacted>#f"},
		{name: "query password and secret", in: "?password=a&secret=b", want: "?password=<redacted>&secret=<redacted>"},
		{name: "env assignment", in: "HF_TOKEN=abcdef", want: "HF_TOKEN=<redacted>"},
		{name: "api key assignment", in: "VLLM_API_KEY=foo", want: "VLLM_API_KEY=<redacted>"},
		{name: "colon assignment", in: "password: hunter2", want: "password: <redacted>"},
		{name: "case insensitive", in: "Secret = s3", want: "Secret = <redacted>"},
		{name: "credentials plural", in: "credentials=abc", want: "credentials=<redacted>"},
		{name: "passwd", in: "passwd=abc", want: "passwd=<redacted>"},
		{name: "json value", in: `{"api_key": "abc", "n": 1}`, want: `{"api_key": "<redacted>", "n": 1}`},
		{name: "python dict", in: `{'api_key': ['abc'], 'port': 8000}`, want: `{'api_key': [<redacted>], 'port': 8000}`},
		{name: "option with equals", in: "vllm serve m --api-key=abc --port 8000", want: "vllm serve m --api-key=<redacted> --port 8000"},
		{name: "option with space", in: "vllm serve m --api-key abc --port 8000", want: "vllm serve m --api-key <redacted> --port 8000"},
		{name: "admin option", in: "--admin-api-key   abc", want: "--admin-api-key   <redacted>"},
		{name: "hf token option", in: "--hf-token abc", want: "--hf-token <redacted>"},
		{name: "long base64", in: "blob aGVsbG8gd29ybGQgdGhpcyBpcyBhIGxvbmcgc2VjcmV0IDEyMzQ1Njc4OTA= end", want: "blob <redacted> end"},
		{name: "long hex", in: "id 3f9a0c4e8b7d6a5f4e3d2c1b0a9f8e7d6c5b4a39 done", want: "id <redacted> done"},
		{name: "hash in a url path", in: "GET https://huggingface.co/org/Llama-3-8B-Instruct/resolve/0e9e39f249a16976918f6564b8830bc894c89659/config.json", want: "GET https://huggingface.co/org/Llama-3-8B-Instruct/resolve/<redacted>/config.json"},
		{name: "base64 with slashes", in: "blob ab1/Cd2eF3gH4/iJ5kL6mN7oP8q/R9sT0uV1wX2yZ3aB4 end", want: "blob <redacted> end"},
		{name: "numeric password", in: "password=1234", want: "password=<redacted>"},

		// Ordinary lines stay.
		{name: "info line", in: "INFO 2025-06-01 12:34:56,789 [engine.py:123] Started server process [4242]", want: "INFO 2025-06-01 12:34:56,789 [engine.py:123] Started server process [4242]"},
		{name: "path", in: "loading /home/user/models/sources/huggingface/meta-llama--Llama-3.1-8B-Instruct/model-00001-of-00004.safetensors", want: "loading /home/user/models/sources/huggingface/meta-llama--Llama-3.1-8B-Instruct/model-00001-of-00004.safetensors"},
		{name: "python path", in: `File "/usr/lib/python3/dist-packages/vllm/entrypoints/openai/api_server_helpers_v2.py", line 12`, want: `File "/usr/lib/python3/dist-packages/vllm/entrypoints/openai/api_server_helpers_v2.py", line 12`},
		{name: "identifier", in: "model_executor_layers_quantization_utils_w8a8_utils loaded", want: "model_executor_layers_quantization_utils_w8a8_utils loaded"},
		{name: "url without credentials", in: "Uvicorn running on http://127.0.0.1:8000/v1/models?limit=10 (Press CTRL+C)", want: "Uvicorn running on http://127.0.0.1:8000/v1/models?limit=10 (Press CTRL+C)"},
		{name: "numbers", in: "throughput 1234567890123456789012345678901234567890123 tokens", want: "throughput 1234567890123456789012345678901234567890123 tokens"},
		{name: "token counts", in: "max_num_batched_tokens=8192, max_tokens: 16, n_prompt_tokens = 11", want: "max_num_batched_tokens=8192, max_tokens: 16, n_prompt_tokens = 11"},
		{name: "llama.cpp token ids", in: "print_info: EOS token        = 2 '</s>'", want: "print_info: EOS token        = 2 '</s>'"},
		{name: "tokenizer option", in: "tokenizer_mode=auto --tokenizer /m --max-tokens 100", want: "tokenizer_mode=auto --tokenizer /m --max-tokens 100"},
		{name: "multi-token word", in: "processing multi-token prompts", want: "processing multi-token prompts"},
		{name: "none value", in: "api_key=None", want: "api_key=None"},
		{name: "throughput", in: "Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 12.5 tokens/s", want: "Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 12.5 tokens/s"},
		{name: "basic word", in: "basic configuration loaded", want: "basic configuration loaded"},
		{name: "empty", in: "", want: ""},
		{name: "invalid utf-8", in: "bad \xff\xfe bytes", want: "bad \xff\xfe bytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := r.RedactString(c.in); got != c.want {
				t.Errorf("Redact(%q)\n got  %q\n want %q", c.in, got, c.want)
			}
		})
	}
}

func TestRedactor_NilAndIdempotent(t *testing.T) {
	var r *Redactor
	if got := r.RedactString("token=abc"); got != "token=<redacted>" {
		t.Errorf("nil Redactor: %q", got)
	}
	r = NewRedactor([]string{"abc"})
	once := r.RedactString("Bearer abc token=abc https://a:b@h")
	if twice := r.RedactString(once); twice != once {
		t.Errorf("not idempotent: %q then %q", once, twice)
	}
}

func TestRedactingWriter_Write(t *testing.T) {
	secret := "split-secret-value"
	cases := []struct {
		name   string
		chunks []string
		want   string
	}{
		{name: "secret split across writes", chunks: []string{"a split-sec", "ret-value b\n"}, want: "a <redacted> b\n"},
		{name: "several lines in one write", chunks: []string{"one\ntwo split-secret-value\nthree"}, want: "one\ntwo <redacted>\nthree"},
		{name: "crlf", chunks: []string{"x token=abc\r\n", "y\r\n"}, want: "x token=<redacted>\r\ny\r\n"},
		{name: "carriage return progress", chunks: []string{"10%\r", "20%\r", "done\n"}, want: "10%\r20%\rdone\n"},
		{name: "partial flushed on close", chunks: []string{"tail without newline token=zz"}, want: "tail without newline token=<redacted>"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var buf bytes.Buffer
			w := NewRedactingWriter(&buf, NewRedactor([]string{secret}))
			for _, ch := range c.chunks {
				n, err := w.Write([]byte(ch))
				if err != nil || n != len(ch) {
					t.Fatalf("Write = %d, %v", n, err)
				}
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			if buf.String() != c.want {
				t.Errorf("got %q, want %q", buf.String(), c.want)
			}
			if _, err := w.Write([]byte("x")); err == nil {
				t.Error("Write after Close succeeded")
			}
		})
	}
}

func TestRedactingWriter_LongLine(t *testing.T) {
	var out [][]byte
	w := NewRedactingWriter(writerFunc(func(p []byte) (int, error) {
		out = append(out, append([]byte(nil), p...))
		return len(p), nil
	}), NewRedactor([]string{"THE-SECRET"}))
	// A line of 150 KiB of words with a secret near each cut.
	word := "lorem ipsum THE-SECRET dolor "
	line := strings.Repeat(word, 150<<10/len(word)) + "\n"
	if _, err := w.Write([]byte(line)); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	var total int
	for _, p := range out {
		if len(p) > MaxLineBytes {
			t.Errorf("piece of %d bytes exceeds the cap", len(p))
		}
		if bytes.Contains(p, []byte("THE-SECRET")) || bytes.Contains(p, []byte("SECRET")) {
			t.Error("secret survived a cut")
		}
		total += len(p)
	}
	if len(out) < 3 || !bytes.HasSuffix(out[len(out)-1], []byte("\n")) {
		t.Errorf("%d pieces, want the line cut in at least 3", len(out))
	}
	if total == 0 {
		t.Error("nothing written")
	}
}

// writerFunc adapts a function to io.Writer.
type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func BenchmarkRedactor_Redact(b *testing.B) {
	r := NewRedactor([]string{"engine-key-0123456789"})
	lines := [][]byte{
		[]byte("INFO 06-01 12:34:56 [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s, Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.0%\n"),
		[]byte("(APIServer pid=4242) INFO: 127.0.0.1:54321 - \"POST /v1/chat/completions HTTP/1.1\" 200 OK\n"),
		[]byte("slot update_slots: id  0 | task 12 | new prompt, n_ctx_slot = 4096, n_keep = 0, n_prompt_tokens = 11\n"),
	}
	var n int64
	for _, l := range lines {
		n += int64(len(l))
	}
	b.SetBytes(n)
	b.ReportAllocs()
	for b.Loop() {
		for _, l := range lines {
			r.Redact(l)
		}
	}
}

func FuzzRedactor_Redact(f *testing.F) {
	for _, seed := range []string{
		"token=abc --api-key x https://u:p@h/?key=1 Bearer zz hf_abcdefghijklmnopqrstuvwxyz",
		"aGVsbG8gd29ybGQgdGhpcyBpcyBhIGxvbmcgc2VjcmV0IDEyMzQ1Njc4OTA=",
		`{"api_key": "abc"} 'token': ['x']`,
		"--token", "password:", "\xff", "",
	} {
		f.Add(seed, "s3cr3t-value")
	}
	f.Fuzz(func(t *testing.T, line, secret string) {
		r := NewRedactor([]string{secret})
		out := r.Redact([]byte(line))
		if len(secret) >= 4 && !strings.Contains(Redacted, secret) && !strings.Contains(secret, "\x00") {
			if strings.Contains(strings.ReplaceAll(string(out), Redacted, "\x00"), secret) {
				t.Fatalf("secret %q survives in %q", secret, out)
			}
		}
	})
}

// writeCounter records each write it is given.
type writeCounter struct{ writes []string }

func (w *writeCounter) Write(p []byte) (int, error) {
	w.writes = append(w.writes, string(p))
	return len(p), nil
}

// TestRedactingWriter_OneWritePerWrite: the lines one write completes go
// out in one write (an engine's log file and ring are written once per
// read of its output, not once per line), redacted each; lines that
// together pass MaxLineBytes go out in pieces of at most that.
func TestRedactingWriter_OneWritePerWrite(t *testing.T) {
	var w writeCounter
	rw := NewRedactingWriter(&w, NewRedactor([]string{"hunter2-secret"}))
	_, _ = rw.Write([]byte("slot launch_slot_: id 0\nslot release: hunter2-secret\nsrv update_slots: all slots are idle\npartial"))
	if len(w.writes) != 1 || w.writes[0] != "slot launch_slot_: id 0\nslot release: <redacted>\nsrv update_slots: all slots are idle\n" {
		t.Fatalf("writes %q, want the three whole lines, redacted, in one", w.writes)
	}
	w.writes = nil
	line := strings.Repeat("x", MaxLineBytes/3) + "\n"
	_, _ = rw.Write([]byte(" end\n" + strings.Repeat(line, 4)))
	total := 0
	for _, s := range w.writes {
		if len(s) > MaxLineBytes || !strings.HasSuffix(s, "\n") {
			t.Fatalf("a write of %d bytes (not whole lines, or over MaxLineBytes)", len(s))
		}
		total += len(s)
	}
	if want := len("partial end\n") + 4*len(line); total != want || len(w.writes) != 2 {
		t.Fatalf("%d writes of %d bytes, want 2 of %d", len(w.writes), total, want)
	}
}
