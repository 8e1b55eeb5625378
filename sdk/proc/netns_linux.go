// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package proc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// enterNewNetns moves the calling thread into a network namespace of its
// own and brings its loopback up. The caller has locked the goroutine to
// its thread and starts the engine from it: a fork takes the calling
// thread's namespaces, so the engine (and all it starts) gets this one,
// which has nothing but loopback. The rest of the process keeps the host's
// namespace; the shim's own socket is a path and stays reachable.
func enterNewNetns() error {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("network namespace: unshare: %w", err)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("network namespace: loopback: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("network namespace: loopback: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("network namespace: loopback flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("network namespace: loopback up: %w", err)
	}
	return nil
}

// joinNetns moves the calling thread into the network namespace of the
// live process id (see enterNewNetns for why the thread matters).
func joinNetns(id Identity) error {
	fd, err := openNetns(id)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("network namespace of pid %d: setns: %w", id.PID, err)
	}
	return nil
}

// netnsInode returns the inode that identifies the network namespace the
// file at path (a /proc/.../ns/net) or fd refers to.
func netnsInode(fd int) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// openNetns opens the network namespace of the process id names and checks,
// after the open, that the PID still names that process (a reused PID
// would hand over another process's namespace).
func openNetns(id Identity) (int, error) {
	if id.PID <= 1 {
		return -1, errors.New("network namespace: no engine process recorded")
	}
	fd, err := unix.Open("/proc/"+strconv.Itoa(id.PID)+"/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("network namespace of pid %d: %w", id.PID, err)
	}
	if !Alive(id) {
		unix.Close(fd)
		return -1, fmt.Errorf("network namespace of pid %d: %w", id.PID, ErrIdentityMismatch)
	}
	return fd, nil
}

// OwnNetns reports whether the process id names lives in a network
// namespace other than this process's (a launch with NetNamespace).
func OwnNetns(id Identity) (bool, error) {
	fd, err := openNetns(id)
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	theirs, err := netnsInode(fd)
	if err != nil {
		return false, err
	}
	// This thread's namespace, which is the process's (a thread that
	// visits another namespace is locked while it does).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return false, err
	}
	return theirs != st.Ino, nil
}

// DialNetns connects to 127.0.0.1:port in the network namespace of the
// process id names (a launch's engine): a connected socket keeps the
// namespace it was made in, so only the socket() call runs in the engine's
// namespace, on a locked thread that returns to its own at once. It
// refuses when the PID no longer names the process or the process shares
// this thread's namespace (the connection would reach the host's loopback,
// where any user may listen).
func DialNetns(ctx context.Context, id Identity, port int) (net.Conn, error) {
	if port <= 0 || port > 65535 {
		return nil, fmt.Errorf("dial in network namespace: bad port %d", port)
	}
	nsFD, err := openNetns(id)
	if err != nil {
		return nil, err
	}
	defer unix.Close(nsFD)
	type made struct {
		fd  int
		err error
	}
	ch := make(chan made, 1)
	// IMPORTANT: its own goroutine: when the thread cannot be put back in
	// its namespace it stays locked, and the runtime ends it with the
	// goroutine instead of running other goroutines in the wrong namespace.
	go func() {
		fd, restored, err := socketInNetns(nsFD)
		if restored {
			runtime.UnlockOSThread()
		}
		ch <- made{fd, err}
	}()
	m := <-ch
	if m.err != nil {
		return nil, m.err
	}
	if err := connectLoopback(ctx, m.fd, port); err != nil {
		unix.Close(m.fd)
		return nil, err
	}
	f := os.NewFile(uintptr(m.fd), "netns-conn")
	c, err := net.FileConn(f) // duplicates the descriptor
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("dial in network namespace: %w", err)
	}
	return c, nil
}

// socketInNetns makes a TCP socket in the namespace nsFD refers to. It
// locks the calling goroutine to its thread; restored is true when the
// thread is back in its own namespace (the caller may unlock it).
func socketInNetns(nsFD int) (fd int, restored bool, err error) {
	runtime.LockOSThread()
	self, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, true, fmt.Errorf("dial in network namespace: own namespace: %w", err)
	}
	defer unix.Close(self)
	own, err1 := netnsInode(self)
	theirs, err2 := netnsInode(nsFD)
	if err := errors.Join(err1, err2); err != nil {
		return -1, true, fmt.Errorf("dial in network namespace: %w", err)
	}
	if own == theirs {
		return -1, true, errors.New("dial in network namespace: the engine shares the host's network namespace")
	}
	if err := unix.Setns(nsFD, unix.CLONE_NEWNET); err != nil {
		return -1, true, fmt.Errorf("dial in network namespace: setns: %w", err)
	}
	fd, serr := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err := unix.Setns(self, unix.CLONE_NEWNET); err != nil {
		if serr == nil {
			unix.Close(fd)
		}
		return -1, false, fmt.Errorf("dial in network namespace: return to own namespace: %w", err)
	}
	if serr != nil {
		return -1, true, fmt.Errorf("dial in network namespace: socket: %w", serr)
	}
	return fd, true, nil
}

// connectLoopback connects the non-blocking socket fd to 127.0.0.1:port,
// waiting at most until ctx's deadline (5 s without one).
func connectLoopback(ctx context.Context, fd, port int) error {
	addr := fmt.Sprintf("127.0.0.1:%d in the engine's network namespace", port)
	err := unix.Connect(fd, &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}})
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EINPROGRESS) {
		return &net.OpError{Op: "dial", Net: "tcp", Err: fmt.Errorf("%s: %w", addr, os.NewSyscallError("connect", err))}
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(5 * time.Second)
	}
	for {
		wait := time.Until(deadline)
		if wait <= 0 || ctx.Err() != nil {
			return &net.OpError{Op: "dial", Net: "tcp", Err: fmt.Errorf("%s: %w", addr, context.DeadlineExceeded)}
		}
		// Short slices, so that a cancelled ctx is seen.
		ms := int(min(wait, 50*time.Millisecond) / time.Millisecond)
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		n, err := unix.Poll(fds, max(ms, 1))
		if err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("dial %s: poll: %w", addr, err)
		}
		if n == 0 {
			continue
		}
		soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			return fmt.Errorf("dial %s: %w", addr, err)
		}
		if soErr != 0 {
			return &net.OpError{Op: "dial", Net: "tcp", Err: fmt.Errorf("%s: %w", addr, os.NewSyscallError("connect", unix.Errno(soErr)))}
		}
		return nil
	}
}

var netnsProbe struct {
	once sync.Once
	ok   bool
}

// NetnsSupported reports whether this process can start an engine in a
// network namespace of its own: it runs as root and the kernel lets it
// make one (a container may forbid unshare even to root). It tries once,
// on a thread of its own that then ends.
func NetnsSupported() bool {
	netnsProbe.once.Do(func() {
		if os.Geteuid() != 0 {
			return
		}
		done := make(chan bool, 1)
		go func() {
			// IMPORTANT: the thread goes back to its namespace; when it
			// cannot, the goroutine ends locked and the runtime ends the
			// thread (or, on the main thread, never runs Go code on it
			// again).
			runtime.LockOSThread()
			self, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				runtime.UnlockOSThread()
				done <- false
				return
			}
			defer unix.Close(self)
			if unix.Unshare(unix.CLONE_NEWNET) != nil {
				runtime.UnlockOSThread()
				done <- false
				return
			}
			if unix.Setns(self, unix.CLONE_NEWNET) != nil {
				done <- false
				return
			}
			runtime.UnlockOSThread()
			done <- true
		}()
		netnsProbe.ok = <-done
	})
	return netnsProbe.ok
}
