// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package raftlog

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/fleet/fsm"
	"github.com/capyctl/capyctl/core/pki"
	"github.com/capyctl/capyctl/core/store"
	"github.com/capyctl/capyctl/core/structs"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"go.uber.org/goleak"
)

// waitDeadline bounds every poll: generous, a condition usually holds in
// well under a second.
const waitDeadline = 15 * time.Second

// testTuning makes elections and commits fast on loopback, yet slow
// enough that a follower starved of CPU for a moment on a loaded 2-core
// machine does not call an election between a test's waitLeader and its
// next Apply (150 ms did: "not the leader" one run in a few at load 10).
var testTuning = Tuning{
	HeartbeatTimeout:   400 * time.Millisecond,
	ElectionTimeout:    400 * time.Millisecond,
	LeaderLeaseTimeout: 200 * time.Millisecond,
	CommitTimeout:      5 * time.Millisecond,
}

// testLogger is raft's logs on stderr when CAPYCTL_TEST_RAFT_LOG is set.
func testLogger() hclog.Logger {
	if os.Getenv("CAPYCTL_TEST_RAFT_LOG") == "" {
		return hclog.NewNullLogger()
	}
	return hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: os.Stderr})
}

// newCA makes a cluster CA.
func newCA(t *testing.T) *pki.CA {
	t.Helper()
	ca, err := pki.LoadOrCreateCA(filepath.Join(t.TempDir(), "ca"), nil)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// peerCreds returns a server peer certificate of ca for name.
func peerCreds(t *testing.T, ca *pki.CA, name string) *pki.Credentials {
	t.Helper()
	key, err := pki.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	iss, err := ca.IssueServerPeer(pki.ServerPeerRequest{Name: name, Public: key.Public()})
	if err != nil {
		t.Fatal(err)
	}
	return pki.NewCredentials(key, iss)
}

// testNode is one server: its store, state machine and raft node.
type testNode struct {
	*Node
	name  string
	addr  string
	dir   string
	state *fsm.State
	store *store.Store
}

// listen binds a loopback listener.
func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// startNode starts a server named name on ln, its certificate from ca, its
// files in dir ("": a new directory).
func startNode(t *testing.T, ca *pki.CA, name, dir string, ln net.Listener, bootstrap []Peer, tuning Tuning) *testNode {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	st, err := store.Open(store.PathIn(filepath.Join(dir, "state")), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	state, err := fsm.Open(st, nil)
	if err != nil {
		t.Fatal(err)
	}
	listenTLS, dialTLS := pki.ServerPeerTLS(ca.Certificate(), peerCreds(t, ca, name), nil)
	n, err := Open(Options{
		ID: name, Dir: filepath.Join(dir, "raft"), Listener: ln,
		ListenTLS: listenTLS, DialTLS: dialTLS,
		State: state, Bootstrap: bootstrap, Tuning: tuning, Logger: testLogger().Named(name),
	})
	if err != nil {
		t.Fatalf("Open %s: %v", name, err)
	}
	state.SetLog(n)
	t.Cleanup(func() { _ = n.Close() })
	return &testNode{Node: n, name: name, addr: ln.Addr().String(), dir: dir, state: state, store: st}
}

// startCluster starts size servers that bootstrap together.
func startCluster(t *testing.T, ca *pki.CA, size int, tuning Tuning) []*testNode {
	t.Helper()
	lns := make([]net.Listener, size)
	peers := make([]Peer, size)
	for i := range lns {
		lns[i] = listen(t)
		peers[i] = Peer{ID: fmt.Sprintf("server-%d", i+1), Address: lns[i].Addr().String()}
	}
	nodes := make([]*testNode, size)
	for i := range nodes {
		nodes[i] = startNode(t, ca, peers[i].ID, "", lns[i], peers, tuning)
	}
	return nodes
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitDeadline)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitLeader waits until one of nodes leads and every other one names it.
func waitLeader(t *testing.T, nodes []*testNode) *testNode {
	t.Helper()
	var leader *testNode
	waitFor(t, "a leader every server agrees on", func() bool {
		leader = nil
		for _, n := range nodes {
			if n.Stats().State == "leader" {
				if leader != nil {
					return false
				}
				leader = n
			}
		}
		if leader == nil {
			return false
		}
		for _, n := range nodes {
			if s := n.Stats(); s.LeaderID != leader.name || s.LeaderAddress != leader.addr {
				return false
			}
		}
		return true
	})
	return leader
}

func joined(host string) fsm.Command { return fsm.HostJoined{Host: host} }

// apply commits c through n's state and returns the apply's error.
func apply(n *testNode, c fsm.Command) error {
	_, _, err := n.state.Apply(c)
	return err
}

// waitHost waits until every node's state holds host.
func waitHost(t *testing.T, nodes []*testNode, host string) {
	t.Helper()
	for _, n := range nodes {
		waitFor(t, n.name+" to apply host "+host, func() bool { _, ok := n.state.Host(host); return ok })
	}
}

func TestNode_ReplicatesCommands(t *testing.T) {
	nodes := startCluster(t, newCA(t), 3, testTuning)
	leader := waitLeader(t, nodes)

	if err := apply(leader, joined("gpu-a")); err != nil {
		t.Fatalf("Apply on the leader: %v", err)
	}
	// Propose returns once the leader applied it.
	if _, ok := leader.state.Host("gpu-a"); !ok {
		t.Fatal("the leader's state lacks the command Propose returned for")
	}
	waitHost(t, nodes, "gpu-a")

	// A refusal of the state machine comes back through the log, and
	// changes no server.
	err := apply(leader, fsm.HostDrain{Host: "nobody", Drain: true})
	if !structs.HasCode(err, structs.CodeNotFound) {
		t.Fatalf("drain of an unknown host: %v, want not_found", err)
	}
	if err := apply(leader, fsm.HostDrain{Host: "gpu-a", Drain: true}); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		waitFor(t, n.name+" to drain gpu-a", func() bool { h, _ := n.state.Host("gpu-a"); return h.Drained })
		if got := n.state.Hosts(); len(got) != 1 {
			t.Errorf("%s hosts %+v, want gpu-a alone", n.name, got)
		}
	}

	s := leader.Stats()
	if s.State != "leader" || s.Term == 0 || s.LastIndex < 3 || s.LeaderID != leader.name || len(s.Servers) != 3 {
		t.Errorf("leader stats %+v", s)
	}
}

func TestNode_FollowerRefuses(t *testing.T) {
	nodes := startCluster(t, newCA(t), 3, testTuning)
	leader := waitLeader(t, nodes)
	for _, n := range nodes {
		if n == leader {
			continue
		}
		err := apply(n, joined("gpu-b"))
		var se *structs.Error
		if !structs.HasCode(err, structs.CodeNotLeader) || !asError(err, &se) {
			t.Fatalf("%s: Apply on a follower: %v, want not_leader", n.name, err)
		}
		if se.Details["leader_id"] != leader.name || se.Details["leader_address"] != leader.addr {
			t.Errorf("%s: details %v, want the leader %s at %s", n.name, se.Details, leader.name, leader.addr)
		}
		if _, ok := n.state.Host("gpu-b"); ok {
			t.Errorf("%s applied a command it refused", n.name)
		}
		if err := n.AddVoter("server-9", "127.0.0.1:1"); !structs.HasCode(err, structs.CodeNotLeader) {
			t.Errorf("%s: AddVoter on a follower: %v, want not_leader", n.name, err)
		}
	}
}

func asError(err error, target **structs.Error) bool {
	*target = structs.AsError(err)
	return *target != nil
}

func TestNode_LeaderLost(t *testing.T) {
	nodes := startCluster(t, newCA(t), 3, testTuning)
	old := waitLeader(t, nodes)
	if err := apply(old, joined("gpu-a")); err != nil {
		t.Fatal(err)
	}
	waitHost(t, nodes, "gpu-a")

	if err := old.Close(); err != nil {
		t.Fatalf("stop the leader: %v", err)
	}
	var rest []*testNode
	for _, n := range nodes {
		if n != old {
			rest = append(rest, n)
		}
	}
	leader := waitLeader(t, rest)
	if leader == old {
		t.Fatal("the stopped server still leads")
	}
	if err := apply(leader, joined("gpu-b")); err != nil {
		t.Fatalf("Apply on the new leader: %v", err)
	}
	waitHost(t, rest, "gpu-b")
	waitHost(t, rest, "gpu-a")
	if _, ok := old.state.Host("gpu-b"); ok {
		t.Error("the stopped server applied a command")
	}
}

func TestNode_SnapshotToNewServer(t *testing.T) {
	tuning := testTuning
	// Snapshots only when asked, and the log behind one compacted down to
	// two entries: a server added later cannot catch up from the log.
	tuning.SnapshotInterval = time.Hour
	tuning.SnapshotThreshold = 1 << 40
	tuning.TrailingLogs = 2
	ca := newCA(t)
	nodes := startCluster(t, ca, 3, tuning)
	leader := waitLeader(t, nodes)
	const hosts = 20
	for i := range hosts {
		if err := apply(leader, joined(fmt.Sprintf("gpu-%02d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := apply(leader, fsm.Placed{Placement: &fsm.Placement{
		Deployment: "chat", Hosts: []fsm.HostShare{{Host: "gpu-00", Instances: 2}}, Routes: []string{"chat-model"}, Revision: 1,
	}}); err != nil {
		t.Fatal(err)
	}
	if err := leader.Snapshot(); err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	s := leader.Stats()
	if s.LastSnapshotIndex < hosts {
		t.Fatalf("last snapshot index %d, want at least %d", s.LastSnapshotIndex, hosts)
	}
	first, err := leader.logStore.FirstIndex()
	if err != nil {
		t.Fatal(err)
	}
	if first <= 1 {
		t.Fatalf("the log still starts at %d after the snapshot: not compacted", first)
	}

	ln := listen(t)
	fresh := startNode(t, ca, "server-4", "", ln, nil, tuning)
	if err := leader.AddVoter(fresh.name, fresh.addr); err != nil {
		t.Fatalf("AddVoter: %v", err)
	}
	waitFor(t, "the new server to restore the snapshot", func() bool { return fresh.fsm.restores.Load() > 0 })
	waitFor(t, "the new server's state to match the leader's", func() bool {
		return reflect.DeepEqual(fresh.state.Hosts(), leader.state.Hosts()) && reflect.DeepEqual(fresh.state.Placements(), leader.state.Placements())
	})
	if p, ok := fresh.state.RouteOwner("chat-model"); !ok || p.Deployment != "chat" {
		t.Errorf("the restored routes: %v, %v", p, ok)
	}
	// The new server follows the log past the snapshot.
	if err := apply(leader, joined("gpu-late")); err != nil {
		t.Fatal(err)
	}
	waitHost(t, append(nodes, fresh), "gpu-late")
	if got := len(leader.Stats().Servers); got != 4 {
		t.Errorf("%d servers in the configuration, want 4", got)
	}
}

func TestNode_Restart(t *testing.T) {
	tuning := testTuning
	tuning.SnapshotInterval = time.Hour
	tuning.SnapshotThreshold = 1 << 40
	ca := newCA(t)
	n := waitLeader(t, startCluster(t, ca, 1, tuning))
	for _, h := range []string{"gpu-a", "gpu-b"} {
		if err := apply(n, joined(h)); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Snapshot(); err != nil {
		t.Fatal(err)
	}
	// One entry after the snapshot: the restart restores the snapshot,
	// then replays it.
	if err := apply(n, fsm.HostRemoved{Host: "gpu-a"}); err != nil {
		t.Fatal(err)
	}
	want := n.state.Hosts()
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if err := n.store.Close(); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", n.addr)
	if err != nil {
		t.Skipf("the port %s is taken again: %v", n.addr, err)
	}
	// The bootstrap list is ignored: the directory holds raft's state.
	again := startNode(t, ca, n.name, n.dir, ln, []Peer{{ID: n.name, Address: n.addr}}, tuning)
	if again.fsm.restores.Load() != 1 {
		t.Errorf("%d restores at start, want the snapshot's", again.fsm.restores.Load())
	}
	waitLeader(t, []*testNode{again})
	waitFor(t, "the log after the snapshot to be replayed", func() bool { return reflect.DeepEqual(again.state.Hosts(), want) })
	if err := apply(again, joined("gpu-c")); err != nil {
		t.Fatalf("Apply after the restart: %v", err)
	}
}

// TestStream_ClusterCAOnly checks raft's transport itself: an RPC between
// two servers of the cluster's CA goes through; a server whose certificate
// is from another CA can neither send one nor answer one; nor can a host's
// certificate of the same CA.
func TestStream_ClusterCAOnly(t *testing.T) {
	ca, other := newCA(t), newCA(t)
	hostKey, err := pki.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	// A host's certificate, signed through enrolment.
	auth, err := pki.NewAuthority(pki.AuthorityOptions{CA: ca, Store: pki.NewMemStore(), ServerNames: []string{"localhost"}})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := auth.NewJoinToken(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.NewCSR(hostKey, "gpu-a")
	if err != nil {
		t.Fatal(err)
	}
	hostIss, err := auth.Enroll(pki.EnrollRequest{Token: tok, CSR: csr})
	if err != nil {
		t.Fatal(err)
	}

	transport := func(trusts *pki.CA, creds *pki.Credentials) *raft.NetworkTransport {
		ln := listen(t)
		listenTLS, dialTLS := pki.ServerPeerTLS(trusts.Certificate(), creds, nil)
		stream := &tlsStream{ln: ln, listen: listenTLS, dial: dialTLS, advertise: tcpAddr(ln.Addr().String()), timeout: 5 * time.Second}
		tr := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{Stream: stream, MaxPool: 1, Timeout: 5 * time.Second, Logger: testLogger()})
		done := make(chan struct{})
		answered := make(chan struct{})
		t.Cleanup(func() { _ = tr.Close(); close(done); <-answered })
		// Answer every vote request until the test ends.
		go func() {
			defer close(answered)
			for {
				select {
				case rpc := <-tr.Consumer():
					rpc.Respond(&raft.RequestVoteResponse{Term: 7, Granted: true}, nil)
				case <-done:
					return
				}
			}
		}()
		return tr
	}
	a := transport(ca, peerCreds(t, ca, "server-a"))
	b := transport(ca, peerCreds(t, ca, "server-b"))
	stranger := transport(other, peerCreds(t, other, "server-x"))
	host := transport(ca, pki.NewCredentials(hostKey, hostIss))
	// Trusts the cluster's CA, shows a certificate of another: only the
	// cluster's end can refuse it.
	impostor := transport(ca, peerCreds(t, other, "server-y"))

	vote := func(from, to *raft.NetworkTransport) error {
		var resp raft.RequestVoteResponse
		err := from.RequestVote("to", to.LocalAddr(), &raft.RequestVoteRequest{Term: 7}, &resp)
		if err == nil && !resp.Granted {
			err = fmt.Errorf("no vote in the answer")
		}
		return err
	}
	cases := []struct {
		name     string
		from, to *raft.NetworkTransport
		wantOK   bool
	}{
		{"two servers of the cluster", b, a, true},
		{"a server of another CA dials the cluster", stranger, a, false},
		{"the cluster dials a server of another CA", a, stranger, false},
		{"a host's certificate dials a server", host, a, false},
		{"a certificate of another CA dials a server", impostor, a, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := vote(c.from, c.to)
			t.Logf("RequestVote: %v", err)
			if (err == nil) != c.wantOK {
				t.Fatalf("RequestVote: %v, want ok=%v", err, c.wantOK)
			}
		})
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestNode_AloneElectsAtOnce: a server that is its configuration's only
// voter does not wait a heartbeat timeout (here a minute) to lead.
func TestNode_AloneElectsAtOnce(t *testing.T) {
	tuning := testTuning
	tuning.HeartbeatTimeout, tuning.ElectionTimeout = time.Minute, time.Minute
	n := startCluster(t, newCA(t), 1, tuning)[0]
	leads, changed := n.Leadership()
	for !leads {
		select {
		case <-changed:
		case <-time.After(waitDeadline):
			t.Fatal("a server alone did not lead")
		}
		leads, changed = n.Leadership()
	}
	if err := apply(n, joined("gpu-a")); err != nil {
		t.Fatal(err)
	}
}

// TestNode_DefaultTiming: with no Tuning a follower gives up on a silent
// leader after 600 ms (raft's own default, 1 s, left a cluster without a
// leader for up to 3 s), the election timeout is no shorter, and the
// heartbeat timeout stays above the leader's lease, which electAlone
// lowers it to: a server alone leads at once with the defaults too. The
// commit timeout is 10 ms.
func TestNode_DefaultTiming(t *testing.T) {
	n := startCluster(t, newCA(t), 1, Tuning{})[0]
	rc := n.raft.ReloadableConfig()
	if rc.HeartbeatTimeout != 600*time.Millisecond || rc.ElectionTimeout != 600*time.Millisecond {
		t.Fatalf("default heartbeat and election timeouts: %s and %s, want 600ms each", rc.HeartbeatTimeout, rc.ElectionTimeout)
	}
	if lease := raft.DefaultConfig().LeaderLeaseTimeout; lease >= rc.HeartbeatTimeout {
		t.Fatalf("the leader lease %s is not below the heartbeat timeout %s: electAlone cannot lower it", lease, rc.HeartbeatTimeout)
	}
	waitFor(t, "a server alone leads", func() bool { l, _ := n.Leadership(); return l })
	// A follower learns of a lone committed change within 10 to 20 ms,
	// not raft's 50 to 100.
	c := raft.DefaultConfig()
	Tuning{}.apply(c)
	if c.CommitTimeout != 10*time.Millisecond {
		t.Fatalf("default commit timeout %s, want 10ms", c.CommitTimeout)
	}
	// A heartbeat timeout set alone keeps an election timeout raft takes.
	c = raft.DefaultConfig()
	c.LocalID = "server-1"
	Tuning{HeartbeatTimeout: 2 * time.Second, LeaderLeaseTimeout: time.Second}.apply(c)
	if err := raft.ValidateConfig(c); err != nil || c.ElectionTimeout != 2*time.Second {
		t.Fatalf("heartbeat timeout 2s alone: election timeout %s, %v", c.ElectionTimeout, err)
	}
}

// TestNode_Leadership follows leadership from one server to another on
// the nodes' signals.
func TestNode_Leadership(t *testing.T) {
	nodes := startCluster(t, newCA(t), 3, testTuning)
	old := waitLeader(t, nodes)
	waitFor(t, "the leader's own signal", func() bool { l, _ := old.Leadership(); return l })
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	var rest []*testNode
	for _, n := range nodes {
		if n != old {
			rest = append(rest, n)
		}
	}
	leader := waitLeader(t, rest)
	waitFor(t, "the new leader's signal", func() bool { l, _ := leader.Leadership(); return l })
	for _, n := range rest {
		if l, _ := n.Leadership(); l != (n == leader) {
			t.Errorf("%s says it leads: %v", n.name, l)
		}
	}
	if err := leader.Barrier(5 * time.Second); err != nil {
		t.Fatalf("Barrier on the leader: %v", err)
	}
}

// TestNode_UnknownCommandHalts: a committed command this server cannot
// read stops its state machine (the state is not moved past it) until the
// node closes; one flagged ignorable is skipped.
func TestNode_UnknownCommandHalts(t *testing.T) {
	n := waitLeader(t, startCluster(t, newCA(t), 1, testTuning))
	if _, _, err := n.Propose([]byte(`{"op":"future","v":1,"ignorable":true,"body":{}}`)); err != nil {
		t.Fatalf("an ignorable command: %v", err)
	}
	if err := apply(n, joined("gpu-a")); err != nil {
		t.Fatal(err)
	}
	proposed := make(chan error, 1)
	go func() {
		_, _, err := n.Propose([]byte(`{"op":"future","v":1,"body":{}}`))
		proposed <- err
	}()
	select {
	case <-n.state.Halted():
	case <-time.After(waitDeadline):
		t.Fatal("the state did not halt on an unknown command")
	}
	var unknown *fsm.UnknownCommandError
	if !errors.As(n.state.HaltErr(), &unknown) || unknown.Op != "future" {
		t.Fatalf("halted for %v", n.state.HaltErr())
	}
	applied := n.state.Applied()
	if err := n.Close(); err != nil {
		t.Logf("close: %v", err)
	}
	<-proposed
	if n.state.Applied() != applied {
		t.Fatal("the halted state moved")
	}
	if _, ok := n.state.Host("gpu-a"); !ok {
		t.Fatal("the command before the unknown one is missing")
	}
}
