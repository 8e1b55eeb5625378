// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package fakeengine

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
)

// Listen binds a TCP address at once (so port 0 is resolved and can be
// printed) but puts the socket in the listening state only at the first
// Accept; until then a connection attempt is refused. That is what vLLM
// and SGLang do while they load: they bind their port (with SO_REUSEADDR,
// as here) before the model loads and serve HTTP only after. Serve calls
// Accept at once for a flavour that answers while loading and only when
// ready for one that does not, so with this listener both behave like the
// real engines.
func Listen(network, address string) (net.Listener, error) {
	addr, err := net.ResolveTCPAddr(network, address)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", address, err)
	}
	family, sa := syscall.AF_INET6, syscall.Sockaddr(nil)
	if ip4 := addr.IP.To4(); ip4 != nil || addr.IP == nil && network == "tcp4" {
		s := &syscall.SockaddrInet4{Port: addr.Port}
		if ip4 != nil {
			copy(s.Addr[:], ip4)
		}
		family, sa = syscall.AF_INET, s
	} else {
		s := &syscall.SockaddrInet6{Port: addr.Port}
		copy(s.Addr[:], addr.IP.To16())
		sa = s
	}
	fd, err := syscall.Socket(family, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, syscall.IPPROTO_TCP)
	if err != nil {
		return nil, fmt.Errorf("listen %s: socket: %w", address, err)
	}
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("listen %s: setsockopt: %w", address, err)
	}
	if err := syscall.Bind(fd, sa); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("listen %s: bind: %w", address, err)
	}
	bound, err := syscall.Getsockname(fd)
	if err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("listen %s: getsockname: %w", address, err)
	}
	return &deferredListener{fd: fd, addr: tcpAddrOf(bound)}, nil
}

// ListenUnix binds a Unix socket at path at once and listens at the first
// Accept, as Listen does for TCP: vLLM binds --uds before the model loads
// (create_server_unix_socket, a plain bind, which fails when the path
// exists) and llama-server binds a --host ending in .sock. Until the
// engine is ready a connection attempt is refused. The socket's mode
// follows the umask, as a Python or C bind does: the launch directory's
// 0700 is what keeps other users out.
func ListenUnix(path string) (net.Listener, error) {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("listen %s: socket: %w", path, err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("listen %s: bind: %w", path, err)
	}
	return &deferredListener{fd: fd, addr: &net.UnixAddr{Name: path, Net: "unix"}}, nil
}

// tcpAddrOf converts a socket address.
func tcpAddrOf(sa syscall.Sockaddr) *net.TCPAddr {
	switch s := sa.(type) {
	case *syscall.SockaddrInet4:
		return &net.TCPAddr{IP: net.IP(s.Addr[:]).To4(), Port: s.Port}
	case *syscall.SockaddrInet6:
		return &net.TCPAddr{IP: net.IP(s.Addr[:]), Port: s.Port}
	}
	return &net.TCPAddr{}
}

// deferredListener is a bound socket that starts listening on first Accept.
type deferredListener struct {
	mu     sync.Mutex
	fd     int
	addr   net.Addr
	ln     net.Listener
	closed bool
}

// Accept listens on the first call, then accepts.
func (l *deferredListener) Accept() (net.Conn, error) {
	ln, err := l.listening()
	if err != nil {
		return nil, err
	}
	return ln.Accept()
}

// listening turns the bound socket into a net.Listener once.
func (l *deferredListener) listening() (net.Listener, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, net.ErrClosed
	}
	if l.ln != nil {
		return l.ln, nil
	}
	if err := syscall.Listen(l.fd, syscall.SOMAXCONN); err != nil {
		return nil, fmt.Errorf("listen %s: %w", l.addr, err)
	}
	f := os.NewFile(uintptr(l.fd), "fake-engine-listener")
	ln, err := net.FileListener(f) // duplicates the descriptor
	f.Close()
	l.fd = -1
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", l.addr, err)
	}
	if ul, ok := ln.(*net.UnixListener); ok {
		// The engine does not remove its socket on exit; the launch
		// directory goes with the launch.
		ul.SetUnlinkOnClose(false)
	}
	l.ln = ln
	return ln, nil
}

// Close releases the port.
func (l *deferredListener) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return net.ErrClosed
	}
	l.closed = true
	if l.ln != nil {
		return l.ln.Close()
	}
	if l.fd >= 0 {
		err := syscall.Close(l.fd)
		l.fd = -1
		return err
	}
	return errors.New("listener has no socket")
}

// Addr is the bound address (with the port chosen for port 0).
func (l *deferredListener) Addr() net.Addr { return l.addr }
