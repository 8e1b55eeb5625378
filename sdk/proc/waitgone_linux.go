// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package proc

import (
	"context"
	"errors"
	"time"

	"golang.org/x/sys/unix"
)

// goneReread is how often WaitGone reads /proc on a kernel without pidfds
// (before Linux 5.3).
const goneReread = 250 * time.Millisecond

// WaitGone blocks until the process id names is gone (exited, a zombie, or
// its PID taken by another process), or ctx ends (then it returns ctx's
// error). It waits on a pidfd, which the kernel makes readable the moment
// the process exits, whoever its parent is, so it costs nothing while the
// process runs; it holds one OS thread in poll(2) for as long as it waits.
// Where pidfds are missing it reads /proc every 250 ms instead.
func WaitGone(ctx context.Context, id Identity) error {
	fd, err := unix.PidfdOpen(id.PID, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return rereadUntilGone(ctx, id)
	}
	defer unix.Close(fd)
	// The fd pins the PID from here on: whether it still names the
	// recorded process is read once, now.
	if !Alive(id) {
		return nil
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return rereadUntilGone(ctx, id)
	}
	defer unix.Close(p[0])
	// ctx's end closes the pipe's write end, which wakes the poll.
	stop := context.AfterFunc(ctx, func() { unix.Close(p[1]) })
	defer func() {
		if stop() {
			unix.Close(p[1])
		}
	}()
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}, {Fd: int32(p[0]), Events: unix.POLLIN}}
	for {
		_, err := unix.Poll(fds, -1)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return rereadUntilGone(ctx, id)
		case fds[0].Revents != 0:
			return nil
		case fds[1].Revents != 0:
			return ctx.Err()
		}
	}
}

// rereadUntilGone is WaitGone without a pidfd.
func rereadUntilGone(ctx context.Context, id Identity) error {
	t := time.NewTicker(goneReread)
	defer t.Stop()
	for Alive(id) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}
