// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"errors"
	"net"
	"syscall"

	"github.com/capyctl/capyctl/core/structs"
)

// listenTCP binds one of the role's listeners. A busy address is its own
// code (address_in_use, exit 29, retryable): after a reboot the previous
// role, or a slow program, may still hold it, and a supervisor retries it
// (the systemd units restart on it, unlike a wrong configuration); the
// message names the setting and the flag that choose another address.
func listenTCP(addr, setting, flag string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		return ln, nil
	}
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, structs.Wrap(structs.CodeAddressInUse, err,
			"%s %s is taken by another process (a role still stopping, or another program): stop it, or choose another address with %s", setting, addr, flag)
	}
	return nil, structs.Wrap(structs.CodeInvalidConfig, err, "%s %s (choose another with %s)", setting, addr, flag)
}
