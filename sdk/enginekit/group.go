// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package enginekit

import (
	"context"
	"net"
	"net/netip"
	"os"
	"strconv"
	"time"

	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/flags"
	"github.com/capyctl/capyctl/sdk/proc"
)

// What follows is what the drivers of engines that run groups (one model
// over several machines, one rank per machine) share. The core decides
// every fact of a member (Deployment.group: rank, size, topology, the
// head's address and rendezvous port, this host's peer address, RDMA
// required); a driver renders them into its engine's own multi-node
// options and adds no address or NCCL_* variable of its own (NCCL_NET for
// require_rdma excepted: RDMAEnv).

// Group refusal codes (core/structs/errors.go's catalogue).
const (
	// CodeGroupShapeUnsupported, followed by ":<family>", is a group the
	// engine cannot run (llama.cpp and custom run none; TensorFold runs
	// tensor_parallel 2 on exactly two machines).
	CodeGroupShapeUnsupported = "group_shape_unsupported"
	// CodePeerAddressMissing is a member whose host has no peer address.
	CodePeerAddressMissing = "peer_address_missing"
)

// DefaultRDMADir is where Linux lists the host's RDMA devices (one entry
// per InfiniBand or RoCE device): empty or missing means none.
const DefaultRDMADir = "/sys/class/infiniband"

// GlooSocketEnv is PyTorch's variable naming the network interface Gloo
// (the engines' CPU process groups) uses.
const GlooSocketEnv = "GLOO_SOCKET_IFNAME"

// NCCLNetEnv is NCCL's variable that forces one network module ("IB", its
// verbs transport for InfiniBand and RoCE, or "Socket"): with it set NCCL
// does not fall back to another, and fails its communicator's init with
// "Error: network IB not found." when the module has no device (NCCL_NET,
// since 2.10, docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html;
// ncclNetInit in NVIDIA/nccl src/net.cc).
const NCCLNetEnv = "NCCL_NET"

// RDMAEnv sets what makes a member of a group on a host with require_rdma
// unable to fall back to TCP for its tensor traffic: NCCL_NET=IB, so that
// NCCL uses InfiniBand or RoCE verbs or fails the engine's start. It
// governs NCCL only: the ranks' rendezvous (torch.distributed's TCP
// store) and their CPU process groups (Gloo) run over TCP on the peer
// address whatever it says. Nothing without require_rdma.
func RDMAEnv(env Env, g *sdk.Group) {
	if g != nil && g.RequireRDMA {
		env[NCCLNetEnv] = "IB"
	}
}

// InGroup reports whether a deployment is a member of a group.
func InGroup(dep *sdk.Deployment) bool { return dep.Group != nil }

// GroupWorker reports whether a group member is a worker: any rank but the
// head (rank 0), which alone serves the engine's HTTP API.
func GroupWorker(g *sdk.Group) bool { return g != nil && g.Rank > 0 }

// RefuseGroup refuses a group member on an engine that runs no groups
// (Capabilities.groups false): group_shape_unsupported:<family>.
func RefuseGroup(dep *sdk.Deployment, family, engine string, r *Refusals) {
	if InGroup(dep) {
		r.Add(CodeGroupShapeUnsupported+":"+family, "topology",
			"%s runs a model on one machine: remove topology and placement.hosts, or deploy the group on vLLM or SGLang", engine)
	}
}

// GroupOptions is what CheckGroup reads of the host.
type GroupOptions struct {
	// RDMADir lists the host's RDMA devices; DefaultRDMADir when "".
	RDMADir string
}

// CheckGroup refuses what no engine's member can run with: a rank outside
// the group, no peer address on its host (peer_address_missing), no head
// address or rendezvous port, and RDMA required on a host without an RDMA
// device (capability_missing:rdma). A deployment without a group passes.
func CheckGroup(g *sdk.Group, o GroupOptions, r *Refusals) {
	if g == nil {
		return
	}
	if g.Size < 2 || g.Rank < 0 || g.Rank >= g.Size {
		r.Add(flags.CodeInvalidConfig, "placement.hosts", "rank %d of a group of %d machines: a group has at least two ranks, 0 to size - 1", g.Rank, g.Size)
	}
	if g.TensorParallel < 1 || g.PipelineParallel < 1 {
		r.Add(flags.CodeInvalidConfig, "topology", "tensor_parallel and pipeline_parallel are at least 1 (got %d and %d)", g.TensorParallel, g.PipelineParallel)
	}
	if g.PeerAddress == "" {
		r.Add(CodePeerAddressMissing, "placement.hosts",
			"rank %d's host has no peer address, the address the group's ranks reach it at: set peer_address in its host configuration (or --peer-address, CAPYCTL_PEER_ADDRESS)", g.Rank)
	} else if g.HeadAddress == "" || g.RendezvousPort <= 0 || g.RendezvousPort > 65535 {
		r.Add(flags.CodeInvalidConfig, "placement.hosts", "the group's head address and rendezvous port are missing (%q, %d)", g.HeadAddress, g.RendezvousPort)
	}
	if g.RequireRDMA {
		dir := o.RDMADir
		if dir == "" {
			dir = DefaultRDMADir
		}
		if !HasRDMA(dir) {
			r.Add(CodeCapabilityMissing+":rdma", "require_rdma",
				"this host requires RDMA for group traffic (require_rdma = true) but has no RDMA device (%s is empty or missing): install and load the device's driver, or set require_rdma = false to let the group use TCP", dir)
		}
	}
}

// HasRDMA reports whether dir (DefaultRDMADir) lists an RDMA device.
func HasRDMA(dir string) bool {
	entries, err := os.ReadDir(dir)
	return err == nil && len(entries) > 0
}

// RendezvousAddr is host:port of the group's head, bracketed for IPv6.
func RendezvousAddr(g *sdk.Group) string {
	return net.JoinHostPort(g.HeadAddress, strconv.Itoa(int(g.RendezvousPort)))
}

// lookupTimeout bounds resolving a peer address that is a name.
const lookupTimeout = 2 * time.Second

// InterfaceOf returns the name of the network interface that holds addr
// (an IP address, or a name resolved first), "" when no interface of this
// host does.
func InterfaceOf(addr string) string {
	var ips []netip.Addr
	if ip, err := netip.ParseAddr(addr); err == nil {
		ips = append(ips, ip.Unmap())
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), lookupTimeout)
		defer cancel()
		found, _ := net.DefaultResolver.LookupNetIP(ctx, "ip", addr)
		for _, ip := range found {
			ips = append(ips, ip.Unmap())
		}
	}
	ifaces, err := net.Interfaces()
	if err != nil {
		return ""
	}
	for _, ifc := range ifaces {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			n, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			have, ok := netip.AddrFromSlice(n.IP)
			if !ok {
				continue
			}
			for _, ip := range ips {
				if have.Unmap() == ip {
					return ifc.Name
				}
			}
		}
	}
	return ""
}

// GroupShare is one rank's share of n bytes over a group of size
// machines, rounded up: ceil(n / size). Without a group it is n.
func GroupShare(n int64, g *sdk.Group) int64 {
	if g == nil {
		return n
	}
	size := int64(g.Size)
	if size < 2 || n <= 0 {
		return n
	}
	return (n + size - 1) / size
}

// GroupNote is the plan note of a group member: its rank, its role, and
// that its memory hints are its share.
func GroupNote(g *sdk.Group) string {
	role := "the head: it serves the engine's HTTP API"
	if GroupWorker(g) {
		role = "a worker: it serves no inference and holds its share of the model"
	}
	return "group rank " + strconv.Itoa(int(g.Rank)) + " of " + strconv.Itoa(int(g.Size)) + " (" + role +
		"); its memory hints are this rank's share: ceil(weights / " + strconv.Itoa(int(g.Size)) + "), and its own KV cache; " +
		"the ranks meet at " + RendezvousAddr(g) + " with no authentication"
}

// GroupSource is MemoryHints.source for a member: the source of the
// figures and that they are this rank's share.
func GroupSource(source string, g *sdk.Group) string {
	if g == nil {
		return source
	}
	return source + "; group rank share (ceil(total / " + strconv.Itoa(int(g.Size)) + "))"
}

// WorkerReady is a worker's ReadyFunc when it serves no HTTP (vLLM
// --headless, TensorFold's rank 1): ready once its process runs, which
// WaitReady checks before asking. A worker has no canary.
func WorkerReady(context.Context) (bool, string, string) { return true, "", "" }

// WorkerPark answers Park for a worker: it has no API to call (the head's
// park is collective over every rank); the core proves the rank released
// its memory by measuring its processes.
func WorkerPark(in *Instance, tier string) *sdk.ParkResponse {
	if tier == "" {
		tier = in.Residency
	}
	in.MarkParked(tier)
	return &sdk.ParkResponse{Detail: "a worker rank parks with its head (" + tier + "); nothing to call on this host"}
}

// WorkerWake answers Wake for a worker: at once, without a canary (the
// head's wake and its wake check follow).
func WorkerWake(in *Instance) *sdk.WakeResponse {
	in.MarkParked("")
	return &sdk.WakeResponse{Detail: "a worker rank wakes with its head; nothing to call on this host"}
}

// WorkerLoad is a worker's load: it serves no requests.
func WorkerLoad() *sdk.LoadResponse { return &sdk.LoadResponse{Known: true} }

// groupListener reports whether a group member may listen on a: its
// engine's rendezvous and collective sockets listen on its peer address or
// on every address, never on the leased API port, which stays on loopback.
func (in *Instance) groupListener(a netip.AddrPort) bool {
	if in.Group == nil || int(a.Port()) == in.Port {
		return false
	}
	addr := a.Addr().Unmap()
	if addr.IsUnspecified() {
		return true
	}
	peer, err := netip.ParseAddr(in.Group.PeerAddress)
	return err == nil && peer.Unmap() == addr
}

// offLoopbackAddr is a listener of the launch that is neither on loopback
// nor a group member's peer listener, "" when none.
func (in *Instance) offLoopbackAddr() string {
	in.membersMu.Lock()
	// A relaunch on the same Instance has a new group: follow that one.
	if in.members == nil || in.membersPgid != in.Launched.Pgid {
		in.members = proc.NewGroup(in.Launched.Pgid)
		in.membersPgid = in.Launched.Pgid
	}
	addrs, err := in.members.ListeningAddrs()
	in.membersMu.Unlock()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if !proc.IsLoopback(a) && !in.groupListener(a) {
			return a.String()
		}
	}
	return ""
}
