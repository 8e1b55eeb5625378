// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package router

// IdleConns returns the connections of taken-over streams that wait for
// their client's next request.
func (rt *Router) IdleConns() int {
	rt.streams.mu.Lock()
	defer rt.streams.mu.Unlock()
	return len(rt.streams.idle)
}

// PooledEngineConns returns the engine connections kept for the next
// request, every engine together.
func (rt *Router) PooledEngineConns() int {
	rt.engine.mu.Lock()
	defer rt.engine.mu.Unlock()
	n := 0
	for _, list := range rt.engine.idle {
		n += len(list)
	}
	return n
}

// AssembledEngineReads returns the reads of engine connections made for
// complete answers assembled from a stream, every engine together.
func (rt *Router) AssembledEngineReads() int64 { return rt.engine.assembledReads.Load() }

// EnginesClosingAfterStream returns how many engines the router saw
// closing their connection after a stream.
func (rt *Router) EnginesClosingAfterStream() int {
	rt.engine.mu.Lock()
	defer rt.engine.mu.Unlock()
	return len(rt.engine.closers)
}
