// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build !unix

package router

// initRaw: without unix read(2), reads hold the buffer while they wait.
func (s *sseReader) initRaw() {}

// readConn reads what the connection has into the buffer.
func (s *sseReader) readConn() (int, error) {
	return s.readPlain()
}

// lowWater: no low-water mark here; an assembled answer is read in gathers.
func (s *sseReader) lowWater() bool { return false }
