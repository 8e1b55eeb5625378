// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package raftlog

import (
	"time"

	"github.com/hashicorp/raft"
)

// Raft's timing where Tuning leaves it zero. raft's own defaults are a
// heartbeat timeout and an election timeout of 1 s and a leader lease of
// 500 ms. A follower calls an election once its randomized check (every 1
// to 2 heartbeat timeouts) finds no word from the leader for a heartbeat
// timeout, so a lost leader was noticed 1 to 3 s after it went, and the
// election is won only once the second survivor noticed too (pre-vote: a
// follower that still knows a leader refuses). The heartbeat timeout is
// 600 ms, and the election timeout with it, because the lease already
// bounds what the cluster tolerates: a leader that hears from no quorum
// for LeaderLeaseTimeout (raft's 500 ms, kept) steps down, so a stall of
// 500 ms costs the leader its leadership, and the followers' longer
// patience only delayed the next one. A lone follower that misses
// heartbeats for 600 ms (its own stall) disrupts nothing: its pre-vote is
// refused by the others while they hear the leader. 600 ms stays above the
// lease, which Node.electAlone needs. Measured:
// BenchmarkServers_LeaderLossToMutation in plugins-testkit/bench.
//
// The commit timeout is 10 ms (raft's is 50 ms): a follower learns that an
// entry is committed from the leader's next append, and when no other
// change follows, from the one the leader sends after a random 1 to 2
// commit timeouts: a lone change (a deploy is one command) reached the
// followers' state 50 to 100 ms after the leader's, and a mutation a
// follower relays is answered once the follower applied it. The cost is
// one small append per follower every 10 to 20 ms while the leader is
// idle.
const (
	defaultHeartbeatTimeout = 600 * time.Millisecond
	defaultElectionTimeout  = 600 * time.Millisecond
	defaultCommitTimeout    = 10 * time.Millisecond
)

// Tuning overrides raft's timing; a zero field keeps the node's default
// (defaultHeartbeatTimeout, defaultElectionTimeout, defaultCommitTimeout,
// raft's own for the rest). Tests use short timeouts; an operator's configuration does not
// reach these yet.
type Tuning struct {
	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	CommitTimeout      time.Duration
	// SnapshotInterval is how often raft checks whether to snapshot, and
	// SnapshotThreshold how many entries since the last snapshot make it.
	SnapshotInterval  time.Duration
	SnapshotThreshold uint64
	// TrailingLogs is how many entries a snapshot leaves in the log (the
	// rest is compacted away); a follower further behind gets the
	// snapshot instead.
	TrailingLogs uint64
}

// apply sets c's timing: Tuning's fields, the node's defaults for the
// zero ones.
func (t Tuning) apply(c *raft.Config) {
	set := func(dst *time.Duration, v time.Duration) {
		if v > 0 {
			*dst = v
		}
	}
	c.HeartbeatTimeout = defaultHeartbeatTimeout
	set(&c.HeartbeatTimeout, t.HeartbeatTimeout)
	c.ElectionTimeout = max(defaultElectionTimeout, c.HeartbeatTimeout) // raft wants it no shorter
	set(&c.ElectionTimeout, t.ElectionTimeout)
	set(&c.LeaderLeaseTimeout, t.LeaderLeaseTimeout)
	c.CommitTimeout = defaultCommitTimeout
	set(&c.CommitTimeout, t.CommitTimeout)
	set(&c.SnapshotInterval, t.SnapshotInterval)
	if t.SnapshotThreshold > 0 {
		c.SnapshotThreshold = t.SnapshotThreshold
	}
	if t.TrailingLogs > 0 {
		c.TrailingLogs = t.TrailingLogs
	}
}
