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
