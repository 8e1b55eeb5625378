// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package config

import "testing"

// TestListen_HostDefaultsToLoopback (L8): a host's own inference endpoint
// listens on loopback unless set (the server reaches the host over the
// connection the host opened); a standalone role and a server keep every
// address.
func TestListen_HostDefaultsToLoopback(t *testing.T) {
	for role, want := range map[string]string{RoleHost: "127.0.0.1:8443", RoleStandalone: "0.0.0.0:8443", RoleServer: "0.0.0.0:8443"} {
		c, err := Load(LoadOptions{Env: []string{"HOME=/h"}, Flags: map[string]string{"role": role}})
		if err != nil {
			t.Fatal(err)
		}
		if c.Listen != want {
			t.Errorf("%s: listen = %q, want %q", role, c.Listen, want)
		}
		if src := c.Provenance()["listen"]; src.From != FromDefault {
			t.Errorf("%s: listen from %+v, want the default", role, src)
		}
	}
	c, err := Load(LoadOptions{Env: []string{"HOME=/h"}, Flags: map[string]string{"role": RoleHost, "listen": "0.0.0.0:9443"}})
	if err != nil || c.Listen != "0.0.0.0:9443" {
		t.Fatalf("a host that sets listen: %v %+v", err, c)
	}
}
