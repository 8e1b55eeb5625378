// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package proc

import (
	"net"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

func TestListeningAddrs(t *testing.T) {
	l := startEngine(t, engineSpec(t, "listen=0.0.0.0:0,listen=127.0.0.1:0", nil))
	text := waitTail(t, l.LaunchDir, "ready")
	m := regexp.MustCompile(`listening (\S+)`).FindAllStringSubmatch(text, -1)
	if len(m) != 2 {
		t.Fatalf("listeners in tail:\n%s", text)
	}
	all, err := ListeningAddrs(l.Pgid)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		printed  string
		loopback bool
	}{
		{name: "all interfaces", printed: m[0][1], loopback: false},
		{name: "loopback", printed: m[1][1], loopback: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want := netip.MustParseAddrPort(c.printed)
			found := false
			for _, a := range all {
				if a == want {
					found = true
				}
			}
			if !found {
				t.Fatalf("ListeningAddrs = %v, want %v", all, want)
			}
			if IsLoopback(want) != c.loopback {
				t.Errorf("IsLoopback(%v) = %v", want, !c.loopback)
			}
		})
	}
	if _, err := ListeningAddrs(1 << 30); err == nil {
		t.Error("ListeningAddrs of an empty group succeeded")
	}
}

func TestListeningAddrs_IPv6(t *testing.T) {
	ln, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skip("no IPv6 loopback:", err)
	}
	ln.Close()
	l := startEngine(t, engineSpec(t, "listen=[::1]:0,listen=[::]:0", nil))
	text := waitTail(t, l.LaunchDir, "ready")
	m := regexp.MustCompile(`listening (\S+)`).FindAllStringSubmatch(text, -1)
	all, err := ListeningAddrs(l.Pgid)
	if err != nil || len(m) != 2 {
		t.Fatalf("ListeningAddrs = %v, %v; tail:\n%s", all, err, text)
	}
	for _, mm := range m {
		want := netip.MustParseAddrPort(mm[1])
		found := false
		for _, a := range all {
			found = found || a == want
		}
		if !found {
			t.Errorf("ListeningAddrs = %v, want %v", all, want)
		}
	}
}

func TestParseProcNetAddr(t *testing.T) {
	cases := []struct {
		name    string
		in      string
		want    string
		wantErr bool
	}{
		{name: "v4 loopback", in: "0100007F:1F90", want: "127.0.0.1:8080"},
		{name: "v4 any", in: "00000000:0050", want: "0.0.0.0:80"},
		{name: "v6 loopback", in: "00000000000000000000000001000000:1F90", want: "[::1]:8080"},
		{name: "v6 any", in: "00000000000000000000000000000000:0016", want: "[::]:22"},
		{name: "v4-mapped loopback", in: "0000000000000000FFFF00000100007F:0050", want: "[::ffff:127.0.0.1]:80"},
		{name: "no port", in: "0100007F", wantErr: true},
		{name: "bad hex", in: "zz00007F:0050", wantErr: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseProcNetAddr(c.in)
			if (err != nil) != c.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, c.wantErr)
			}
			if err == nil && got.String() != c.want {
				t.Errorf("got %v, want %v", got, c.want)
			}
		})
	}
}

func TestIsLoopback(t *testing.T) {
	cases := []struct {
		name string
		addr string
		want bool
	}{
		{name: "127.0.0.1", addr: "127.0.0.1:80", want: true},
		{name: "127.0.0.2", addr: "127.0.0.2:80", want: true},
		{name: "::1", addr: "[::1]:80", want: true},
		{name: "mapped", addr: "[::ffff:127.0.0.1]:80", want: true},
		{name: "any v4", addr: "0.0.0.0:80", want: false},
		{name: "any v6", addr: "[::]:80", want: false},
		{name: "lan", addr: "192.168.1.5:80", want: false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := IsLoopback(netip.MustParseAddrPort(c.addr)); got != c.want {
				t.Errorf("IsLoopback(%s) = %v, want %v", c.addr, got, c.want)
			}
		})
	}
}

func TestPortFree(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if PortFree(port) {
		t.Errorf("PortFree(%d) with a listener", port)
	}
	ln.Close()
	if !PortFree(port) {
		t.Errorf("PortFree(%d) after close", port)
	}
	for _, p := range []int{0, -1, 70000} {
		if PortFree(p) {
			t.Errorf("PortFree(%s) = true", strconv.Itoa(p))
		}
	}
}

// TestDiagListeners_AgreesWithProcNet: the kernel's sock_diag answer and
// the text tables of /proc/net list the same listeners of this process.
func TestDiagListeners_AgreesWithProcNet(t *testing.T) {
	var lns []net.Listener
	for _, a := range []string{"127.0.0.1:0", "0.0.0.0:0", "[::1]:0", "[::]:0"} {
		network := "tcp4"
		if strings.HasPrefix(a, "[") {
			network = "tcp6"
		}
		ln, err := net.Listen(network, a)
		if err != nil {
			continue // no IPv6 here
		}
		defer ln.Close()
		lns = append(lns, ln)
	}
	diag, err := diagListeners()
	if err != nil {
		t.Skip("no sock_diag here:", err)
	}
	inodes := map[string]bool{}
	socketInodes(os.Getpid(), inodes)
	var fromProc []netip.AddrPort
	for _, name := range []string{"tcp", "tcp6"} {
		addrs, err := parseListeners(procRoot+"/self/net/"+name, inodes)
		if err == nil {
			fromProc = append(fromProc, addrs...)
		}
	}
	var fromDiag []netip.AddrPort
	for inode, a := range diag {
		if inodes[inode] {
			fromDiag = append(fromDiag, a)
		}
	}
	sortAddrs := func(v []netip.AddrPort) {
		sort.Slice(v, func(i, j int) bool { return v[i].Compare(v[j]) < 0 })
	}
	sortAddrs(fromProc)
	sortAddrs(fromDiag)
	if len(fromDiag) != len(lns) || !slices.Equal(fromDiag, fromProc) {
		t.Fatalf("sock_diag %v, /proc/net %v, %d listeners", fromDiag, fromProc, len(lns))
	}
}
