// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package raftlog

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/structs"
)

// The files of a node's directory.
const (
	// LogFile is raft's log and its own durable state (term, vote): bbolt,
	// through raft-boltdb.
	LogFile = "raft.db"
	// snapshotsRetained is how many snapshots the directory keeps (under
	// snapshots/, raft's FileSnapshotStore).
	snapshotsRetained = 2
)

// Defaults of Options.
const (
	defaultApplyTimeout = 10 * time.Second
	defaultRPCTimeout   = 10 * time.Second
	logCacheEntries     = 512
)

// Peer is one server of the initial configuration.
type Peer struct {
	// ID is the server's name (unique in the cluster).
	ID string
	// Address is the host:port its server-to-server listener is reached at.
	Address string
}

// Options configure a Node.
type Options struct {
	// ID is this server's name in the cluster (raft's ServerID).
	ID string
	// Dir keeps raft's files: raft.db and snapshots/. Made 0700 when
	// missing.
	Dir string
	// Listener is the server-to-server listener, bound (TCP, no TLS: the
	// node serves TLS on it). The node closes it.
	Listener net.Listener
	// Advertise is the address the other servers dial ("": Listener's).
	Advertise string
	// ListenTLS and DialTLS are the server peer configs
	// (pki.ServerPeerTLS).
	ListenTLS, DialTLS *tls.Config
	// Handshaken says Listener's connections went through the mutual TLS
	// handshake already (the server's cluster listener hands raft its
	// ALPN's connections): they are used as they are and ListenTLS is
	// not needed. DialTLS then offers the cluster listener's raft ALPN.
	Handshaken bool
	// State is the state machine every committed command is applied to.
	// Open does not call State.SetLog; the caller does once it is ready to
	// send commands through the node.
	State *fsm.State
	// Bootstrap is the cluster's first configuration, this server among
	// its peers; every server of the first set is given the same list.
	// Empty: this server waits for a leader to add it (Node.AddVoter).
	// Ignored when Dir already holds raft's state (a restart).
	Bootstrap []Peer
	// ApplyTimeout bounds how long Propose waits to hand a command to raft
	// (not the commit itself; 0: 10 s).
	ApplyTimeout time.Duration
	// Tuning overrides raft's timeouts and snapshot thresholds.
	Tuning Tuning
	// Logger receives raft's logs (nil: none).
	Logger hclog.Logger
}

// Node is one server's member of the raft cluster: it implements
// fsm.Log over raft, and publishes leadership and the cluster's changes
// as signals (Leadership, Changed).
type Node struct {
	id           string
	raft         *raft.Raft
	fsm          *stateMachine
	logStore     *raftboltdb.BoltStore
	transport    *raft.NetworkTransport
	applyTimeout time.Duration

	notify   chan bool
	observed chan raft.Observation
	observer *raft.Observer
	done     chan struct{}
	wg       sync.WaitGroup

	closeOnce sync.Once
	closeErr  error

	mu      sync.Mutex
	leader  bool
	changed chan struct{}
}

var _ fsm.Log = (*Node)(nil)

// Open starts this server's raft node: it opens the log and the snapshots
// in Dir, restores the latest snapshot into State and replays the log
// after it, bootstraps the first configuration when asked and none is
// there, and serves the other servers over mutual TLS on Listener.
func Open(o Options) (n *Node, err error) {
	logger, advertise, err := o.check()
	if err != nil {
		return nil, err
	}

	// Each step registers its undo; a failure runs them, newest first.
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()
	undo = append(undo, func() { _ = o.Listener.Close() })

	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("create the raft directory: %w", err)
	}
	logStore, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(o.Dir, LogFile)})
	if err != nil {
		return nil, fmt.Errorf("open the raft log %s: %w", filepath.Join(o.Dir, LogFile), err)
	}
	undo = append(undo, func() { _ = logStore.Close() })
	logs, err := raft.NewLogCache(logCacheEntries, logStore)
	if err != nil {
		return nil, err
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(o.Dir, snapshotsRetained, logger)
	if err != nil {
		return nil, fmt.Errorf("open the raft snapshots: %w", err)
	}

	stream := &tlsStream{ln: o.Listener, listen: o.ListenTLS, dial: o.DialTLS, advertise: tcpAddr(advertise), timeout: defaultHandshakeTimeout,
		handshaken: o.Handshaken}
	transport := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:  stream,
		MaxPool: 3,
		Timeout: defaultRPCTimeout,
		Logger:  logger,
	})
	undo = append(undo, func() { _ = transport.Close() })

	cfg := raft.DefaultConfig()
	cfg.LocalID = raft.ServerID(o.ID)
	cfg.Logger = logger
	o.Tuning.apply(cfg)
	if err := raft.ValidateConfig(cfg); err != nil {
		return nil, structs.Wrap(structs.CodeInvalidConfig, err, "raft")
	}

	if len(o.Bootstrap) > 0 {
		if err := bootstrapOnce(cfg, o, advertise, logs, logStore, snaps, transport); err != nil {
			return nil, err
		}
	}

	return start(o, cfg, logger, logs, logStore, snaps, transport)
}

// start runs raft on the opened stores and the node's goroutine that
// takes its leadership changes and observations.
func start(o Options, cfg *raft.Config, logger hclog.Logger, logs raft.LogStore, logStore *raftboltdb.BoltStore,
	snaps raft.SnapshotStore, transport *raft.NetworkTransport) (*Node, error) {
	// raft sends every change of leadership on NotifyCh and waits for it
	// to be taken: the node's own goroutine takes it at once.
	notify := make(chan bool, 1)
	cfg.NotifyCh = notify
	closing := make(chan struct{})
	timeout := o.ApplyTimeout
	if timeout <= 0 {
		timeout = defaultApplyTimeout
	}
	n := &Node{id: o.ID, logStore: logStore, transport: transport, applyTimeout: timeout,
		notify: notify, observed: make(chan raft.Observation, 64), done: closing}
	n.fsm = &stateMachine{state: o.State, logger: logger, closing: closing, configured: n.publish}
	r, err := raft.NewRaft(cfg, n.fsm, logs, logStore, snaps, transport)
	if err != nil {
		return nil, fmt.Errorf("start raft: %w", err)
	}
	n.raft = r
	n.observer = raft.NewObserver(n.observed, false, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.LeaderObservation, raft.PeerObservation, raft.RaftState:
			return true
		}
		return false
	})
	r.RegisterObserver(n.observer)
	n.wg.Add(1)
	go n.watch()
	n.electAlone(cfg)
	return n, nil
}

// check refuses options a node cannot open with and returns the node's
// logger and the address it advertises.
func (o Options) check() (hclog.Logger, string, error) {
	switch {
	case o.ID == "" || o.Dir == "" || o.Listener == nil || o.State == nil:
		return nil, "", fmt.Errorf("raftlog: a node needs an ID, a directory, a listener and a state")
	case (o.ListenTLS == nil && !o.Handshaken) || o.DialTLS == nil:
		return nil, "", fmt.Errorf("raftlog: a node needs the server peer TLS configs")
	}
	logger := o.Logger
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	advertise := o.Advertise
	if advertise == "" {
		advertise = o.Listener.Addr().String()
	}
	if err := checkAdvertise(advertise); err != nil {
		return nil, "", err
	}
	return logger.Named("raft"), advertise, nil
}

// bootstrapOnce writes the first configuration of a cluster (this server
// and its bootstrap peers) into a raft state that holds none yet; a
// state that has one keeps it.
func bootstrapOnce(cfg *raft.Config, o Options, advertise string, logs raft.LogStore, stable raft.StableStore,
	snaps raft.SnapshotStore, transport raft.Transport) error {
	had, err := raft.HasExistingState(logs, stable, snaps)
	if err != nil {
		return fmt.Errorf("read the raft state: %w", err)
	}
	if had {
		return nil
	}
	conf, err := bootstrapConfiguration(o.ID, advertise, o.Bootstrap)
	if err != nil {
		return err
	}
	if err := raft.BootstrapCluster(cfg, logs, stable, snaps, transport, conf); err != nil {
		return fmt.Errorf("bootstrap the raft cluster: %w", err)
	}
	return nil
}

// electAlone starts the election at once when this server is the only
// voter of its configuration (a server alone, or the first of a
// cluster): raft would otherwise wait a heartbeat timeout (1 to 2 s) to
// notice no leader speaks, and every start of a server alone would take
// that long. Lowering the heartbeat timeout wakes raft's follower loop,
// which finds no contact and stands; the timeout is put back at once.
func (n *Node) electAlone(cfg *raft.Config) {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return
	}
	voters := 0
	self := false
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			voters++
			self = self || s.ID == cfg.LocalID
		}
	}
	if voters != 1 || !self {
		return
	}
	rc := n.raft.ReloadableConfig()
	was := rc.HeartbeatTimeout
	rc.HeartbeatTimeout = cfg.LeaderLeaseTimeout
	if rc.HeartbeatTimeout >= was {
		return
	}
	if err := n.raft.ReloadConfig(rc); err != nil {
		return
	}
	rc.HeartbeatTimeout = was
	_ = n.raft.ReloadConfig(rc)
}

// watch takes raft's leadership notifications and observations and
// publishes them (Leadership, Changed).
func (n *Node) watch() {
	defer n.wg.Done()
	for {
		select {
		case <-n.done:
			return
		case l := <-n.notify:
			n.mu.Lock()
			n.leader = l
			n.mu.Unlock()
			n.publish()
		case <-n.observed:
			n.publish()
		}
	}
}

// publish wakes the waiters on Changed.
func (n *Node) publish() {
	n.mu.Lock()
	ch := n.changed
	n.changed = nil
	n.mu.Unlock()
	if ch != nil {
		close(ch)
	}
}

// Changed returns a channel closed at the next change of this node's
// view: its leadership, the leader it knows, its raft state, the
// configuration's members. A waiter takes the channel before it reads
// Stats, so that a change between the two is never missed.
func (n *Node) Changed() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.changed == nil {
		n.changed = make(chan struct{})
	}
	return n.changed
}

// Leadership reports whether raft last said this server leads (raft's
// NotifyCh: true once it won an election, false once it lost the
// leadership), with a channel closed at the next change.
func (n *Node) Leadership() (bool, <-chan struct{}) {
	ch := n.Changed()
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.leader, ch
}

// Term is raft's current term on this server.
func (n *Node) Term() uint64 { return n.raft.CurrentTerm() }

// Barrier returns once every entry committed before it is applied on
// this server (the leader's first duty after an election: its state is
// then the cluster's); not_leader elsewhere.
func (n *Node) Barrier(timeout time.Duration) error {
	if err := n.raft.Barrier(timeout).Error(); err != nil {
		return n.raftError(err)
	}
	return nil
}

// checkAdvertise refuses an address the other servers cannot dial.
func checkAdvertise(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return structs.Wrap(structs.CodeInvalidConfig, err, "the server-to-server address %q", addr)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		return structs.Errf(structs.CodeInvalidConfig, "the server-to-server address %q is not one another server can dial; advertise a reachable address", addr)
	}
	return nil
}

// bootstrapConfiguration checks the first configuration: IDs unique, this
// server among them at its advertised address.
func bootstrapConfiguration(id, advertise string, peers []Peer) (raft.Configuration, error) {
	var conf raft.Configuration
	seen := map[string]bool{}
	self := false
	for _, p := range peers {
		if p.ID == "" || p.Address == "" || seen[p.ID] {
			return conf, structs.Errf(structs.CodeInvalidConfig, "the first servers need unique names and addresses (%q at %q)", p.ID, p.Address)
		}
		seen[p.ID] = true
		if p.ID == id {
			if p.Address != advertise {
				return conf, structs.Errf(structs.CodeInvalidConfig, "this server %q is listed at %q but advertises %q", id, p.Address, advertise)
			}
			self = true
		}
		conf.Servers = append(conf.Servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.Address)})
	}
	if !self {
		return conf, structs.Errf(structs.CodeInvalidConfig, "the first servers do not list this server %q", id)
	}
	return conf, nil
}

// Propose commits data through the log and returns once this server's
// state machine applied it, with the apply's Result (a refusal every
// server made alike) and the entry's index. On a server that is not the
// leader it returns not_leader naming the leader, so the caller can send
// the change there.
func (n *Node) Propose(data []byte) (fsm.Result, uint64, error) {
	if n.raft.State() != raft.Leader {
		return fsm.Result{}, 0, n.notLeader()
	}
	f := n.raft.Apply(data, n.applyTimeout)
	if err := f.Error(); err != nil {
		return fsm.Result{}, 0, n.raftError(err)
	}
	r, _ := f.Response().(fsm.Result)
	return r, f.Index(), nil
}

// notLeader is the refusal of a server that is not the leader.
func (n *Node) notLeader() *structs.Error {
	addr, id := n.raft.LeaderWithID()
	var e *structs.Error
	if id == "" {
		e = structs.Errf(structs.CodeNotLeader, "server %s is not the leader and no leader is elected now; retry once one is", n.id)
	} else {
		e = structs.Errf(structs.CodeNotLeader, "server %s is not the leader; the leader is %s at %s", n.id, id, addr)
	}
	return e.WithDetail("leader_id", string(id)).WithDetail("leader_address", string(addr))
}

// raftError maps a future's error to the catalogue.
func (n *Node) raftError(err error) error {
	switch {
	case errors.Is(err, raft.ErrNotLeader):
		return n.notLeader()
	case errors.Is(err, raft.ErrLeadershipLost):
		// The entry may still commit under the next leader. Server
		// commands are absolute (set, delete), so a retry is safe.
		return n.notLeader().WithDetail("committed", "unknown")
	case errors.Is(err, raft.ErrRaftShutdown):
		return structs.Wrap(structs.CodeShuttingDown, err, "server %s", n.id)
	case errors.Is(err, raft.ErrEnqueueTimeout):
		return structs.Wrap(structs.CodeUnavailable, err, "server %s is too busy to take the change", n.id)
	}
	return structs.Wrap(structs.CodeInternal, err, "server %s", n.id)
}

// AddVoter adds a server to the cluster (on the leader; not_leader
// elsewhere) and returns once the new configuration is committed. The
// server catches up from the log, or from a snapshot when the log no
// longer reaches back far enough.
func (n *Node) AddVoter(id, address string) error {
	if n.raft.State() != raft.Leader {
		return n.notLeader()
	}
	if err := n.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(address), 0, n.applyTimeout).Error(); err != nil {
		return n.raftError(err)
	}
	return nil
}

// RemoveServer removes a server from the cluster (on the leader;
// not_leader elsewhere).
func (n *Node) RemoveServer(id string) error {
	if n.raft.State() != raft.Leader {
		return n.notLeader()
	}
	if err := n.raft.RemoveServer(raft.ServerID(id), 0, n.applyTimeout).Error(); err != nil {
		return n.raftError(err)
	}
	return nil
}

// TransferLeadership hands the leadership to another voter and returns
// once one took it (on the leader; not_leader elsewhere).
func (n *Node) TransferLeadership() error {
	if err := n.raft.LeadershipTransfer().Error(); err != nil {
		return n.raftError(err)
	}
	return nil
}

// Snapshot snapshots the state machine now and compacts the log behind it
// (raft also does both on its own past Tuning's threshold).
func (n *Node) Snapshot() error {
	if err := n.raft.Snapshot().Error(); err != nil {
		return structs.Wrap(structs.CodeInternal, err, "snapshot server %s", n.id)
	}
	return nil
}

// Server is one member of the cluster's configuration.
type Server struct {
	ID      string `json:"id"`
	Address string `json:"address"`
	Voter   bool   `json:"voter"`
}

// Stats is this server's view of the cluster, for `capyctl list servers`.
type Stats struct {
	ID string `json:"id"`
	// State is "leader", "follower", "candidate" or "shutdown".
	State             string `json:"state"`
	Term              uint64 `json:"term"`
	LastIndex         uint64 `json:"last_index"`
	CommitIndex       uint64 `json:"commit_index"`
	AppliedIndex      uint64 `json:"applied_index"`
	LastSnapshotIndex uint64 `json:"last_snapshot_index"`
	// LeaderID and LeaderAddress are empty while no leader is known.
	LeaderID      string `json:"leader_id"`
	LeaderAddress string `json:"leader_address"`
	// LastContact is when a follower last heard from the leader (zero on
	// the leader, or never).
	LastContact time.Time `json:"last_contact,omitzero"`
	// Servers is the configuration as this server knows it.
	Servers []Server `json:"servers"`
}

// Stats returns this server's view of the cluster.
func (n *Node) Stats() Stats {
	s := n.View()
	s.LastSnapshotIndex, _ = strconv.ParseUint(n.raft.Stats()["last_snapshot_index"], 10, 64)
	return s
}

// View is Stats without LastSnapshotIndex, which only raft's Stats map
// gives (built with its configuration printed: most of a link's work on
// every change of the state, one per host, with 100 hosts): the server's
// own paths (its leadership, the leader it relays to, the members it
// tells hosts) read this.
func (n *Node) View() Stats {
	addr, id := n.raft.LeaderWithID()
	s := Stats{
		ID:            n.id,
		State:         strings.ToLower(n.raft.State().String()),
		Term:          n.raft.CurrentTerm(),
		LastIndex:     n.raft.LastIndex(),
		CommitIndex:   n.raft.CommitIndex(),
		AppliedIndex:  n.raft.AppliedIndex(),
		LeaderID:      string(id),
		LeaderAddress: string(addr),
		LastContact:   n.raft.LastContact(),
	}
	if f := n.raft.GetConfiguration(); f.Error() == nil {
		for _, srv := range f.Configuration().Servers {
			s.Servers = append(s.Servers, Server{ID: string(srv.ID), Address: string(srv.Address), Voter: srv.Suffrage == raft.Voter})
		}
	}
	return s
}

// Close stops the node: raft, its transport and listener, and the log. It
// does not hand leadership over first; the others elect a new leader when
// its heartbeats stop.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		close(n.done) // an apply blocked on a halted state returns
		err := n.raft.Shutdown().Error()
		n.raft.DeregisterObserver(n.observer)
		n.wg.Wait()
		err = errors.Join(err, n.transport.Close())
		n.closeErr = errors.Join(err, n.logStore.Close())
	})
	return n.closeErr
}
