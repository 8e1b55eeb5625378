// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package dashboard_test

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capyctl/capyctl/core/runinfo"
	"github.com/capyctl/capyctl/plugins-testkit/attack"
	"github.com/capyctl/capyctl/plugins-testkit/harness"
)

// dashboardWorks logs in to the dashboard at mgmt with the admin token
// over fresh connections and reads the session back; it returns what
// failed, "" when all answered.
func dashboardWorks(mgmt, token string) string {
	jar, _ := cookiejar.New(nil)
	hc := &http.Client{Jar: jar, Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}
	base := "http://" + mgmt
	resp, err := hc.Get(base + "/dashboard/")
	if err != nil {
		return "GET /dashboard/: " + err.Error()
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "GET /dashboard/: " + resp.Status
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/dashboard/login", strings.NewReader(`{"token":"`+token+`"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Origin", base)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err = hc.Do(req)
	if err != nil {
		return "POST /dashboard/login: " + err.Error()
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "POST /dashboard/login: " + resp.Status
	}
	req, _ = http.NewRequest(http.MethodGet, base+"/dashboard/session", nil)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err = hc.Do(req)
	if err != nil {
		return "GET /dashboard/session: " + err.Error()
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "GET /dashboard/session: " + resp.Status
	}
	return ""
}

// TestManagement_LocalFloodLocksNoOperatorOut (M5): any local user can
// open connections to the management listener's loopback port. With 600
// idle ones from 127.0.0.1 (the CLI's and the browser's address) and 300
// more from other loopback addresses held open, the CLI still answers
// (through the role's Unix socket, which only the role's user opens) and
// the dashboard still logs in (its requests take the idle connections'
// slots); with 600 more that each sent a byte, the CLI still answers.
// Before, 512 idle connections made the CLI report
// role_not_running and the dashboard stop answering.
func TestManagement_LocalFloodLocksNoOperatorOut(t *testing.T) {
	r := harness.StartStandalone(t, harness.Options{})
	sock := filepath.Join(r.StateDir, runinfo.ManagementSocketFile)
	if st, err := os.Stat(sock); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("management socket %s: %v %v, want mode 0600", sock, st, err)
	}
	one := attack.OpenFlood(attack.FloodOptions{Target: r.Info.Management, PerSource: 600})
	defer one.Close()
	many := attack.OpenFlood(attack.FloodOptions{Target: r.Info.Management, PerSource: 10, Sources: attack.Loopback(2, 30)})
	defer many.Close()
	t.Logf("flood: %d+%d idle connections open", one.Opened(), many.Opened())
	if one.Opened() < 512 {
		t.Fatalf("the flood opened %d connections from 127.0.0.1, want over 512", one.Opened())
	}
	if out, errOut, code := r.CLI("status"); code != 0 {
		t.Fatalf("capyctl status under the flood: exit %d\n%s%s", code, out, errOut)
	}
	if out, errOut, code := r.CLI("list", "deployments"); code != 0 {
		t.Fatalf("capyctl list deployments under the flood: exit %d\n%s%s", code, out, errOut)
	}
	if why := dashboardWorks(r.Info.Management, r.Creds.AdminToken); why != "" {
		t.Fatalf("the dashboard under the flood: %s", why)
	}
	// A flood that sends a byte on each connection (a request begun and
	// never finished) is not idle: its slots are held until the header
	// deadline. The CLI still answers, through the socket.
	drip := attack.OpenFlood(attack.FloodOptions{Target: r.Info.Management, PerSource: 600, Send: []byte("G")})
	defer drip.Close()
	if out, errOut, code := r.CLI("status"); code != 0 {
		t.Fatalf("capyctl status under a flood of begun requests: exit %d\n%s%s", code, out, errOut)
	}
}
