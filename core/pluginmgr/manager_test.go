// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package pluginmgr

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health/grpc_health_v1"

	"github.com/capyctl/capyctl/core/structs"
	"github.com/capyctl/capyctl/plugins-testkit/freeze"
	"github.com/capyctl/capyctl/sdk"
	"github.com/capyctl/capyctl/sdk/proc"
)

func TestManager_DriverSocketIsOwnerOnly(t *testing.T) {
	r := newRig(t)
	// A socket directory left wider by someone is made owner-only again.
	if err := os.MkdirAll(r.socketDir(), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(r.socketDir(), 0o777); err != nil {
		t.Fatal(err)
	}
	old := syscall.Umask(0)
	defer syscall.Umask(old)

	m := r.manager(Deadlines{}, nil)
	defer m.Shutdown(false)
	mustDriver(t, m, "alpha")
	rec := r.record("alpha")
	if rec.Network != "unix" || filepath.Dir(rec.Addr) != r.socketDir() {
		t.Fatalf("driver listens on %s %s, want a socket in %s", rec.Network, rec.Addr, r.socketDir())
	}
	dir, err := os.Stat(r.socketDir())
	if err != nil {
		t.Fatal(err)
	}
	if dir.Mode().Perm() != 0o700 {
		t.Fatalf("socket directory mode %v, want 0700", dir.Mode().Perm())
	}
	sock, err := os.Stat(rec.Addr)
	if err != nil {
		t.Fatal(err)
	}
	if sock.Mode()&os.ModeSocket == 0 || sock.Mode().Perm()&0o077 != 0 {
		t.Fatalf("socket mode %v: group or others have access", sock.Mode())
	}

	t.Run("another uid cannot connect", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root to run a connect attempt as uid 65534 (nobody); the modes above are checked anyway")
		}
		bin := exposedCopyOfTestBinary(t)
		// Control: nobody can connect to a socket that lets it, so a
		// refusal below is the socket's doing.
		open := filepath.Join(filepath.Dir(bin), "open.sock")
		ln, err := net.Listen("unix", open)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		_ = os.Chmod(open, 0o777)
		if code, out := connectAsNobody(t, bin, open); code != 0 {
			t.Fatalf("control: nobody could not connect to an open socket: exit %d %s", code, out)
		}
		if code, out := connectAsNobody(t, bin, rec.Addr); code != 3 {
			t.Fatalf("nobody connecting to the driver socket: exit %d %s, want refused for permissions (3)", code, out)
		}
	})
}

func TestManager_LongSocketDirectoryFallsBackToAPrivateOne(t *testing.T) {
	r := newRig(t)
	r.sockets = filepath.Join(r.dir, strings.Repeat("long-state-directory-", 5), "run", "plugins")
	m := r.manager(Deadlines{}, nil)
	d := mustDriver(t, m, "alpha")
	if _, err := d.Flags(context.Background(), &sdk.FlagsRequest{}); err != nil {
		t.Fatal(err)
	}
	rec := r.record("alpha")
	dir := filepath.Dir(rec.Addr)
	if !strings.HasPrefix(filepath.Base(dir), fallbackSocketPrefix) {
		t.Fatalf("driver socket %s, want one in a private temporary directory", rec.Addr)
	}
	st, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o700 || st.Sys().(*syscall.Stat_t).Uid != uint32(os.Geteuid()) {
		t.Fatalf("fallback socket directory mode %v uid %d", st.Mode().Perm(), st.Sys().(*syscall.Stat_t).Uid)
	}
	// A re-attach finds it there.
	second := r.manager(Deadlines{}, nil)
	mustDriver(t, second, "alpha")
	if second.PID("alpha") != m.PID("alpha") {
		t.Fatalf("not re-attached: pid %d, was %d", second.PID("alpha"), m.PID("alpha"))
	}
	second.Shutdown(false)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("fallback socket directory left after a clean stop: %v", err)
	}
}

// exposedCopyOfTestBinary copies the test binary where uid 65534 can run it
// (go test builds it in a directory only its owner can enter).
func exposedCopyOfTestBinary(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "pluginmgr-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	src, err := os.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	bin := filepath.Join(dir, "helper")
	dst, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	return bin
}

func connectAsNobody(t *testing.T, bin, path string) (int, string) {
	t.Helper()
	cmd := exec.Command(bin, path)
	cmd.Env = []string{helperEnv + "=connect"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), string(out)
	}
	if err != nil {
		t.Fatalf("run the connect helper as nobody: %v", err)
	}
	return 0, string(out)
}

func TestManager_DriverRefusesClientWithoutCertificate(t *testing.T) {
	r := newRig(t)
	m := r.manager(Deadlines{}, nil)
	defer m.Shutdown(false)
	mustDriver(t, m, "alpha")
	rec := r.record("alpha")
	recorded := func(t *testing.T) credentials.TransportCredentials {
		withCert, err := clientTLSFrom(rec.TLS)
		if err != nil {
			t.Fatalf("the recorded TLS material: %v", err)
		}
		return credentials.NewTLS(withCert.config)
	}
	cases := []struct {
		name  string
		creds func(t *testing.T) credentials.TransportCredentials
		ok    bool
	}{
		{"plain gRPC", func(*testing.T) credentials.TransportCredentials { return insecure.NewCredentials() }, false},
		{"TLS without a client certificate", func(*testing.T) credentials.TransportCredentials {
			return credentials.NewTLS(&tls.Config{InsecureSkipVerify: true})
		}, false},
		{"TLS with another certificate", func(t *testing.T) credentials.TransportCredentials {
			return credentials.NewTLS(otherClientCert(t))
		}, false},
		// Control: the core's own certificate, as a re-attach uses it.
		{"the recorded client certificate", recorded, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := healthCheck(rec.Addr, c.creds(t))
			if c.ok && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if !c.ok && err == nil {
				t.Fatalf("a client %s was served", c.name)
			}
		})
	}
}

func otherClientCert(t *testing.T) *tls.Config {
	t.Helper()
	c, err := newClientTLS()
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.config.Clone()
	cfg.InsecureSkipVerify = true
	return cfg
}

// healthCheck dials a driver's socket and asks go-plugin's health service.
func healthCheck(path string, creds credentials.TransportCredentials) error {
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(creds), grpc.WithAuthority("localhost"))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = grpc_health_v1.NewHealthClient(conn).Check(ctx, &grpc_health_v1.HealthCheckRequest{Service: goplugin.GRPCServiceName})
	return err
}

func TestManager_ReattachAfterCoreDeathKeepsTheDriver(t *testing.T) {
	r := newRig(t)
	first := r.manager(Deadlines{}, nil)
	mustDriver(t, first, "alpha")
	pid := first.PID("alpha")
	// The first core dies without a word (kill -9): nothing is shut down.
	second := r.manager(Deadlines{}, nil)
	defer second.Shutdown(false)
	d := mustDriver(t, second, "alpha")
	if got := second.PID("alpha"); got != pid {
		t.Fatalf("driver pid %d after the restart, want the re-attached %d", got, pid)
	}
	if _, err := d.Flags(context.Background(), &sdk.FlagsRequest{}); err != nil {
		t.Fatalf("call over the re-attached (mutual TLS) connection: %v", err)
	}
}

func TestManager_DriversDumpNoCore(t *testing.T) {
	r := newRig(t)
	m := r.manager(Deadlines{}, nil)
	defer m.Shutdown(false)
	d := mustDriver(t, m, "alpha")
	desc, err := d.Describe(context.Background(), &sdk.DescribeRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if desc.Version != "dumpable=false" {
		t.Fatalf("the served driver reports %s, want dumpable=false", desc.Version)
	}
	if f := coreLimit(t, m.PID("alpha")); f[0] != "0" || f[1] != "0" {
		t.Fatalf("driver core-file limit %v, want 0 0", f)
	}
}

// coreLimit returns the soft and hard "Max core file size" of a process.
func coreLimit(t *testing.T, pid int) []string {
	t.Helper()
	soft, hard, err := proc.CoreFileLimit(pid)
	if err != nil {
		t.Fatal(err)
	}
	return []string{soft, hard}
}

func TestManager_HungDriver(t *testing.T) {
	r := newRig(t)
	relaunched := make(chan string, 4)
	// Pings miss twice before the kill: well after the call's deadline, so the
	// call meets the stopped driver, not its replacement.
	m := r.manager(Deadlines{Call: 300 * time.Millisecond, PingInterval: 400 * time.Millisecond, PingTimeout: 200 * time.Millisecond},
		func(f string) { relaunched <- f })
	defer m.Shutdown(false)
	alpha, beta := mustDriver(t, m, "alpha"), mustDriver(t, m, "beta")
	stopped := m.PID("alpha")
	freeze.Process(t, stopped)
	t.Cleanup(func() { _ = syscall.Kill(stopped, syscall.SIGKILL) })

	// (a) A call to the stopped driver returns a coded error.
	_, err := alpha.Flags(context.Background(), &sdk.FlagsRequest{})
	if e := structs.AsError(err); e == nil || e.Code != structs.CodeDriverTimeout {
		t.Fatalf("Flags on a stopped driver: %v, want %s", err, structs.CodeDriverTimeout)
	}
	// (b) Another family is served meanwhile.
	if _, err := beta.Start(context.Background(), &sdk.StartRequest{Launch: sdk.LaunchContext{LaunchID: "l1"}}); err != nil {
		t.Fatalf("start on the healthy driver: %v", err)
	}
	// (c) The supervisor's pings find the stopped driver, kill it and
	// launch a new one, and the core is told so it can recover.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go m.Watch(ctx, 20*time.Millisecond)
	eventually(t, "the stopped driver killed", func() bool { return !alive(stopped) })
	eventually(t, "a relaunched driver", func() bool { p := m.PID("alpha"); return p > 0 && p != stopped })
	select {
	case f := <-relaunched:
		if f != "alpha" {
			t.Fatalf("relaunch reported for %s", f)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no relaunch reported")
	}
	if _, err := alpha.Flags(context.Background(), &sdk.FlagsRequest{}); err != nil {
		t.Fatalf("Flags after the relaunch: %v", err)
	}
	if m.PID("beta") == 0 {
		t.Fatal("the healthy driver was touched")
	}
}

func TestManager_AdoptRecordedDrivers(t *testing.T) {
	r := newRig(t)
	first := r.manager(Deadlines{}, nil)
	mustDriver(t, first, "alpha")
	mustDriver(t, first, "beta")
	alpha, beta := first.PID("alpha"), first.PID("beta")
	// beta hangs: the next core cannot re-attach to it.
	freeze.Process(t, beta)
	t.Cleanup(func() { _ = syscall.Kill(beta, syscall.SIGKILL) })

	// The first core dies; the next one uses no driver, then stops cleanly.
	second := r.manager(Deadlines{Call: 300 * time.Millisecond}, nil)
	second.AdoptRecorded(context.Background())
	if got := second.PID("alpha"); got != alpha {
		t.Fatalf("alpha pid %d after adoption, want the re-attached %d", got, alpha)
	}
	eventually(t, "the driver that could not be re-attached ended", func() bool { return !alive(beta) })
	second.Shutdown(false)
	eventually(t, "every recorded driver ended by the clean stop", func() bool { return !alive(alpha) })
	if recs, _ := r.store.ListReattach(); len(recs) != 0 {
		t.Fatalf("reattach records left after a clean stop: %+v", recs)
	}
	if left, _ := os.ReadDir(r.socketDir()); len(left) != 0 {
		t.Fatalf("sockets left after a clean stop: %v", left)
	}
}
