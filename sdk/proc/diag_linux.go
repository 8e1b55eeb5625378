// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package proc

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"strconv"
	"syscall"
)

// The netlink sock_diag interface (linux/sock_diag.h, linux/inet_diag.h):
// the kernel lists the sockets in a given state, here the TCP listeners,
// without writing a text line for every socket of the namespace as
// /proc/net/tcp does. On a busy machine /proc/net/tcp holds thousands of
// rows (TIME_WAIT included) and took 10 ms to read; the listeners alone
// take tens of microseconds.
const (
	netlinkSockDiag   = 4  // NETLINK_SOCK_DIAG
	sockDiagByFamily  = 20 // SOCK_DIAG_BY_FAMILY
	tcpStateListen    = 10 // TCP_LISTEN
	inetDiagReqV2Size = 56 // struct inet_diag_req_v2
	inetDiagMsgSize   = 72 // struct inet_diag_msg
)

// diagListeners returns the TCP listeners of the caller's network
// namespace by socket inode (decimal, as /proc/<pid>/fd shows it).
func diagListeners() (map[string]netip.AddrPort, error) {
	fd, err := syscall.Socket(syscall.AF_NETLINK, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, netlinkSockDiag)
	if err != nil {
		return nil, err
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		return nil, err
	}
	out := map[string]netip.AddrPort{}
	for seq, family := range []uint8{syscall.AF_INET, syscall.AF_INET6} {
		if err := diagDump(fd, uint32(seq+1), family, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// diagDump asks for one family's listeners and reads the answer.
func diagDump(fd int, seq uint32, family uint8, out map[string]netip.AddrPort) error {
	req := make([]byte, syscall.NLMSG_HDRLEN+inetDiagReqV2Size)
	ne := binary.NativeEndian
	ne.PutUint32(req[0:4], uint32(len(req)))
	ne.PutUint16(req[4:6], sockDiagByFamily)
	ne.PutUint16(req[6:8], syscall.NLM_F_REQUEST|syscall.NLM_F_DUMP)
	ne.PutUint32(req[8:12], seq)
	r := req[syscall.NLMSG_HDRLEN:]
	r[0] = family
	r[1] = syscall.IPPROTO_TCP
	ne.PutUint32(r[4:8], 1<<tcpStateListen) // idiag_states
	if err := syscall.Sendto(fd, req, 0, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 32<<10)
	for {
		n, _, err := syscall.Recvfrom(fd, buf, 0)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Seq != seq {
				continue
			}
			switch m.Header.Type {
			case syscall.NLMSG_DONE:
				return nil
			case syscall.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if e := int32(ne.Uint32(m.Data[0:4])); e != 0 {
						return syscall.Errno(-e)
					}
				}
				return errors.New("sock_diag: error answer")
			}
			if len(m.Data) < inetDiagMsgSize {
				continue
			}
			d := m.Data
			// inet_diag_msg: family, state, timer, retrans, then the
			// sockid (sport, dport big-endian; src, dst 16 bytes each;
			// if; cookie), expires, rqueue, wqueue, uid, inode.
			port := binary.BigEndian.Uint16(d[4:6])
			var addr netip.Addr
			if d[0] == syscall.AF_INET {
				addr = netip.AddrFrom4([4]byte(d[8:12]))
			} else {
				addr = netip.AddrFrom16([16]byte(d[8:24])).Unmap()
			}
			inode := ne.Uint32(d[68:72])
			out[strconv.FormatUint(uint64(inode), 10)] = netip.AddrPortFrom(addr, port)
		}
	}
}
