// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The fake LMCache: a KV store by chunk hash, as LMCache's standalone
// server (lmcache/v1/server/__main__.py) keeps KV chunks for the engines
// that connect to it with LMCACHE_REMOTE_URL = "lm://host:port", and the
// engines' side of it (the connector). The real server speaks a binary
// protocol (lmcache/v1/protocol.py: PUT, GET, EXIST, HEALTH with a
// CacheEngineKey); the fake speaks one line per command over TCP, with the
// same commands and no KV bytes:
//
//	PUT <key>\n    → OK\n          store a chunk
//	EXIST <key>\n  → YES\n | NO\n  is a chunk stored
//	HEALTH\n       → OK\n
//	STATS\n        → STATS <chunks> <puts> <hits>\n
//
// A key is a chunk's prefix hash: the SHA-256 of the previous chunk's key
// and this chunk's tokens, so a chunk matches only after the same prefix,
// as LMCache's keys chain token chunks. The chain starts from the engine
// process's seed, as LMCache's starts from vLLM's NONE_HASH
// (FactPythonHashSeed): drawn at random per process unless PYTHONHASHSEED
// fixes it, so a restarted engine finds nothing its previous process
// stored unless the seed is fixed. Only whole chunks are stored and looked
// up (LMCache's save_unfull_chunk = false).

// KVConnector is an external KV cache (Config.KVConnector):
// *LMCacheClient is one.
type KVConnector interface {
	// Lookup returns how many leading prompt tokens the cache holds for
	// the request's cache_salt ("" for none).
	Lookup(salt string, tokens []string) int
	// Store saves the prompt's KV under its cache_salt.
	Store(salt string, tokens []string)
}

// LMCacheDefaultChunk is LMCache's default chunk size in tokens
// (LMCACHE_CHUNK_SIZE).
const LMCacheDefaultChunk = 256

// LMCacheServer is the fake LMCache server: chunks by key, in memory.
type LMCacheServer struct {
	mu     sync.Mutex
	chunks map[string]bool
	puts   int
	hits   int
}

// NewLMCacheServer returns an empty store.
func NewLMCacheServer() *LMCacheServer { return &LMCacheServer{chunks: map[string]bool{}} }

// Serve answers connections on ln until it is closed.
func (s *LMCacheServer) Serve(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		go s.handle(c)
	}
}

// Stats returns the chunks stored, the PUTs and the EXIST hits so far.
func (s *LMCacheServer) Stats() (chunks, puts, hits int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.chunks), s.puts, s.hits
}

func (s *LMCacheServer) handle(c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		f := strings.Fields(line)
		var reply string
		switch {
		case len(f) == 2 && f[0] == "PUT":
			s.mu.Lock()
			s.chunks[f[1]] = true
			s.puts++
			s.mu.Unlock()
			reply = "OK"
		case len(f) == 2 && f[0] == "EXIST":
			s.mu.Lock()
			ok := s.chunks[f[1]]
			if ok {
				s.hits++
			}
			s.mu.Unlock()
			reply = "NO"
			if ok {
				reply = "YES"
			}
		case len(f) == 1 && f[0] == "HEALTH":
			reply = "OK"
		case len(f) == 1 && f[0] == "STATS":
			n, p, h := s.Stats()
			reply = fmt.Sprintf("STATS %d %d %d", n, p, h)
		default:
			reply = "ERR unknown command"
		}
		if _, err := fmt.Fprintln(c, reply); err != nil {
			return
		}
	}
}

// LMCacheClient is an engine's connection to its LMCache server: what the
// fake engines use when launched with LMCache's connector.
type LMCacheClient struct {
	addr  string
	chunk int
	// seed starts every key chain: the process's NONE_HASH.
	seed string

	mu   sync.Mutex
	conn net.Conn
	r    *bufio.Reader
}

// DialLMCache connects to remoteURL ("lm://host:port") with chunks of
// chunk tokens (LMCacheDefaultChunk when 0), and checks the server's
// health. seed starts every key chain: NoneHash of the engine process's
// PYTHONHASHSEED.
func DialLMCache(remoteURL string, chunk int, seed string) (*LMCacheClient, error) {
	u, err := url.Parse(remoteURL)
	if err != nil || u.Scheme != "lm" || u.Host == "" {
		return nil, fmt.Errorf("LMCache remote_url %q: want lm://host:port", remoteURL)
	}
	if chunk <= 0 {
		chunk = LMCacheDefaultChunk
	}
	c := &LMCacheClient{addr: u.Host, chunk: chunk, seed: seed}
	if _, err := c.call("HEALTH"); err != nil {
		return nil, fmt.Errorf("LMCache server %s: %w", u.Host, err)
	}
	return c, nil
}

// Close closes the connection.
func (c *LMCacheClient) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil {
		err := c.conn.Close()
		c.conn = nil
		return err
	}
	return nil
}

// call sends one command and reads its reply, (re)connecting as needed.
func (c *LMCacheClient) call(cmd string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		conn, err := net.DialTimeout("tcp", c.addr, 5*time.Second)
		if err != nil {
			return "", err
		}
		c.conn, c.r = conn, bufio.NewReader(conn)
	}
	_ = c.conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintln(c.conn, cmd); err != nil {
		c.conn.Close()
		c.conn = nil
		return "", err
	}
	line, err := c.r.ReadString('\n')
	if err != nil {
		c.conn.Close()
		c.conn = nil
		return "", err
	}
	return strings.TrimSpace(line), nil
}

// NoneHash is the start of an engine process's key chains from its
// PYTHONHASHSEED, as vLLM's init_none_hash makes NONE_HASH: an integer in
// [0, 4294967295] fixes it; "" or "random" (Python's spellings of unset)
// draws it at random for the process. Anything else is refused, as Python
// refuses to start with it.
func NoneHash(pythonHashSeed string) (string, error) {
	if pythonHashSeed == "" || pythonHashSeed == "random" {
		var b [32]byte
		if _, err := rand.Read(b[:]); err != nil {
			return "", err
		}
		return hex.EncodeToString(b[:]), nil
	}
	n, err := strconv.ParseUint(pythonHashSeed, 10, 32)
	if err != nil {
		return "", fmt.Errorf("Fatal Python error: PYTHONHASHSEED must be \"random\" or an integer in range [0; 4294967295]")
	}
	sum := sha256.Sum256([]byte("none-hash\x00" + strconv.FormatUint(n, 10)))
	return hex.EncodeToString(sum[:]), nil
}

// chunkKeys are the prefix-hash keys of tokens' whole chunks; the chain
// starts from the process's seed and the salt, so a chunk matches only
// in a process with the same seed and under the same salt.
func (c *LMCacheClient) chunkKeys(salt string, tokens []string) []string {
	var keys []string
	prev := c.seed
	if salt != "" {
		sum := sha256.Sum256([]byte(prev + "\x00salt\x00" + salt))
		prev = hex.EncodeToString(sum[:])
	}
	for i := 0; i+c.chunk <= len(tokens); i += c.chunk {
		h := sha256.New()
		h.Write([]byte(prev))
		for _, t := range tokens[i : i+c.chunk] {
			h.Write([]byte(t))
			h.Write([]byte{0})
		}
		prev = hex.EncodeToString(h.Sum(nil))
		keys = append(keys, prev)
	}
	return keys
}

// Lookup returns how many leading tokens the server holds KV for: whole
// chunks, up to the first missing one (LMCache retrieves a prefix).
func (c *LMCacheClient) Lookup(salt string, tokens []string) int {
	n := 0
	for _, k := range c.chunkKeys(salt, tokens) {
		if r, err := c.call("EXIST " + k); err != nil || r != "YES" {
			break
		}
		n += c.chunk
	}
	return n
}

// Store saves the KV of tokens' whole chunks.
func (c *LMCacheClient) Store(salt string, tokens []string) {
	for _, k := range c.chunkKeys(salt, tokens) {
		if _, err := c.call("PUT " + k); err != nil {
			return
		}
	}
}
