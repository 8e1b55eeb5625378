// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package apikeys

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"strings"
)

// The shape of a named key: "capyk_", the public identifier (12 lowercase
// hex digits, 48 random bits), "_", and the secret (32 random bytes, 256
// bits, in unpadded base64url: 43 characters). The prefix lets a secret
// scanner and the log redaction (core/structs) recognise a key; the
// identifier finds the key's record without comparing every digest.
const (
	keyPrefix = "capyk_"
	idLen     = 12
	secretLen = 43
	// KeyLen is the length of a named key.
	KeyLen = len(keyPrefix) + idLen + 1 + secretLen
)

// generate draws a new key: the whole key (shown once), its public
// identifier and the digest the store keeps.
func generate() (plain, id, digest string) {
	var idb [idLen / 2]byte
	var sec [32]byte
	if _, err := rand.Read(idb[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	if _, err := rand.Read(sec[:]); err != nil {
		panic(err)
	}
	id = hex.EncodeToString(idb[:])
	plain = keyPrefix + id + "_" + base64.RawURLEncoding.EncodeToString(sec[:])
	return plain, id, Digest(plain)
}

// idOf returns the public identifier a presented key carries; false for
// anything not shaped as a named key (the role's key, a typo).
func idOf(presented string) (string, bool) {
	if len(presented) != KeyLen || !strings.HasPrefix(presented, keyPrefix) || presented[len(keyPrefix)+idLen] != '_' {
		return "", false
	}
	id := presented[len(keyPrefix) : len(keyPrefix)+idLen]
	for i := 0; i < len(id); i++ {
		if c := id[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return "", false
		}
	}
	return id, true
}

// Digest is "sha256:<hex>" of a key. A key is 256 random bits, so a fast
// digest is as safe to keep as a slow one: nobody can search the space.
func Digest(plain string) string {
	sum := sha256.Sum256([]byte(plain))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// digestBytes decodes a stored digest; false when it is not one.
func digestBytes(d string) ([32]byte, bool) {
	var out [32]byte
	h, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(h) != 64 {
		return out, false
	}
	if _, err := hex.Decode(out[:], []byte(h)); err != nil {
		return out, false
	}
	return out, true
}

// matches compares a presented key with a stored digest in constant time.
func matches(presented string, want [32]byte) bool {
	got := sha256.Sum256([]byte(presented))
	return subtle.ConstantTimeCompare(got[:], want[:]) == 1
}

// secretEqual compares two secrets in constant time, over their digests so
// that the length does not leak either.
func secretEqual(got, want string) bool {
	if want == "" {
		return false
	}
	a, b := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// Prefix is how a key begins, up to its public identifier: enough to tell
// keys apart, nothing of the secret.
func Prefix(id string) string { return keyPrefix + id + "_…" }
