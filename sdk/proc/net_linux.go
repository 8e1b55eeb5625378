// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package proc

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
)

// tcpListen is the socket state LISTEN in /proc/net/tcp.
const tcpListen = "0A"

// ListeningAddrs returns the TCP addresses (IPv4 and IPv6) on which any
// process of the group listens: the namespace's TCP listeners (from the
// kernel's sock_diag, else the LISTEN rows of /proc/<pid>/net/tcp and
// tcp6) whose socket inode one of the group's processes holds open. Sorted, without duplicates. Drivers use it
// to refuse an engine that listens off loopback.
func ListeningAddrs(pgid int) ([]netip.AddrPort, error) {
	return NewGroup(pgid).ListeningAddrs()
}

// ListeningAddrs is the package's ListeningAddrs for the group's members
// as PIDs reads them: a driver that checks a launch again and again keeps
// its Group, so that each check after the first reads only what changed.
func (g *Group) ListeningAddrs() ([]netip.AddrPort, error) {
	pids := g.PIDs()
	if len(pids) == 0 {
		return nil, fmt.Errorf("listening addresses: no live process in group %d", g.pgid)
	}
	inodes := map[string]bool{}
	for _, pid := range pids {
		socketInodes(pid, inodes)
	}
	if len(inodes) == 0 {
		return nil, nil
	}
	if all, err := diagListeners(); err == nil {
		var out []netip.AddrPort
		seen := map[netip.AddrPort]bool{}
		for inode, a := range all {
			if inodes[inode] && !seen[a] {
				seen[a] = true
				out = append(out, a)
			}
		}
		sort.Slice(out, func(i, j int) bool { return out[i].Compare(out[j]) < 0 })
		return out, nil
	}
	// Without sock_diag (a kernel or sandbox without it): the text tables.
	seen := map[netip.AddrPort]bool{}
	var out []netip.AddrPort
	var lastErr error
	read := 0
	for _, name := range []string{"tcp", "tcp6"} {
		// Any member's view will do: the group shares a network namespace
		// unless an engine unshares it, which CapyCTL never asks for.
		var addrs []netip.AddrPort
		var err error
		for _, pid := range pids {
			addrs, err = parseListeners(procRoot+"/"+strconv.Itoa(pid)+"/net/"+name, inodes)
			if err == nil {
				break
			}
		}
		if err != nil {
			if os.IsNotExist(err) {
				continue // no IPv6 in this kernel
			}
			lastErr = err
			continue
		}
		read++
		for _, a := range addrs {
			if !seen[a] {
				seen[a] = true
				out = append(out, a)
			}
		}
	}
	if read == 0 && lastErr != nil {
		return nil, fmt.Errorf("listening addresses: %w", lastErr)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Compare(out[j]) < 0 })
	return out, nil
}

// socketInodes adds the inodes of the sockets pid holds open.
func socketInodes(pid int, into map[string]bool) {
	dir := procRoot + "/" + strconv.Itoa(pid) + "/fd"
	d, err := os.Open(dir)
	if err != nil {
		return
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	for _, n := range names {
		link, err := os.Readlink(dir + "/" + n)
		if err != nil {
			continue
		}
		if strings.HasPrefix(link, "socket:[") && strings.HasSuffix(link, "]") {
			into[link[len("socket:["):len(link)-1]] = true
		}
	}
}

// parseListeners returns the LISTEN rows of a /proc/net/tcp{,6} file whose
// inode is in inodes.
func parseListeners(path string, inodes map[string]bool) ([]netip.AddrPort, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []netip.AddrPort
	sc := bufio.NewScanner(f)
	first := true
	for sc.Scan() {
		if first { // header
			first = false
			continue
		}
		fields := strings.Fields(sc.Text())
		// sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...
		if len(fields) < 10 || fields[3] != tcpListen || !inodes[fields[9]] {
			continue
		}
		ap, err := parseProcNetAddr(fields[1])
		if err != nil {
			continue
		}
		out = append(out, ap)
	}
	return out, sc.Err()
}

// parseProcNetAddr parses "0100007F:1F90" (IPv4) or a 32-digit IPv6 form:
// the address is written as 32-bit words in host byte order, the port in
// hexadecimal.
func parseProcNetAddr(s string) (netip.AddrPort, error) {
	host, port, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("bad address %q", s)
	}
	p, err := strconv.ParseUint(port, 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("bad port in %q: %w", s, err)
	}
	raw, err := hex.DecodeString(host)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, fmt.Errorf("bad address %q", s)
	}
	// Each 32-bit word was printed from host order: reorder its bytes into
	// network order.
	b := make([]byte, len(raw))
	for i := 0; i < len(raw); i += 4 {
		w := binary.BigEndian.Uint32(raw[i : i+4])
		binary.NativeEndian.PutUint32(b[i:i+4], w)
	}
	addr, _ := netip.AddrFromSlice(b)
	return netip.AddrPortFrom(addr, uint16(p)), nil
}
