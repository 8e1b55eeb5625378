// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTLSListener_RefusesAKeyOthersRead (L9): a key_file every local user
// can read is refused, naming the chmod; its group may read it (Debian's
// ssl-cert group shares keys that way).
func TestTLSListener_RefusesAKeyOthersRead(t *testing.T) {
	ca := newTestCA(t, "test CA")
	certPEM, keyPEM := ca.issue(t, "127.0.0.1", 2, false)
	dir := t.TempDir()
	f := TLSFiles{CertFile: filepath.Join(dir, "cert.pem"), KeyFile: filepath.Join(dir, "key.pem")}
	writeFile(t, f.CertFile, certPEM)
	writeFile(t, f.KeyFile, keyPEM)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for mode, ok := range map[os.FileMode]bool{0o644: false, 0o604: false, 0o640: true, 0o600: true} {
		if err := os.Chmod(f.KeyFile, mode); err != nil {
			t.Fatal(err)
		}
		_, err := TLSListener(ln, f, nil)
		switch {
		case ok && err != nil:
			t.Errorf("key mode %04o: %v, want it served", mode, err)
		case !ok && (err == nil || !strings.Contains(err.Error(), "chmod 600")):
			t.Errorf("key mode %04o: %v, want a refusal naming the chmod", mode, err)
		}
	}
}
