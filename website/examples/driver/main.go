// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Command capyctl-driver-hello is the example of the driver-author guide
// (website/content/guides/driver-author.md): a third-party CapyCTL driver
// built only on sdk/. Build it as capyctl-driver-hello, put it in a role's
// plugin directory, and the role launches it like its own drivers.
package main

import "github.com/capyctl/capyctl/sdk/plugin"

func main() {
	// Serve speaks go-plugin's handshake and the driver protocol over
	// gRPC until the role stops the driver. It never returns.
	plugin.Serve(New())
}
