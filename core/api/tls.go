// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"sync"

	"github.com/hashicorp/go-hclog"
)

// TLSFiles are the inference listener's certificate files (the tls block
// of the role configuration). An empty CertFile is plain HTTP.
type TLSFiles struct {
	CertFile string
	KeyFile  string
	// ClientCAFile, when set, requires every client to present a
	// certificate signed by one of its CAs.
	ClientCAFile string
}

// Enabled reports whether the files ask for TLS.
func (f TLSFiles) Enabled() bool { return f.CertFile != "" }

// TLSListener serves TLS on ln with the certificate (and client CAs) read
// from files. The files are checked at each new connection's handshake and
// read again when one changed (its modification time, size or inode): a
// renewed certificate is served from the next connection on, and open
// connections are not touched. A new set that does not load (a key written
// after its certificate, say) is logged and the last good one is served
// until the files load again. The first load must succeed.
func TLSListener(ln net.Listener, f TLSFiles, logger hclog.Logger) (net.Listener, error) {
	src, err := newCertSource(f, logger)
	if err != nil {
		return nil, err
	}
	return tls.NewListener(ln, &tls.Config{
		MinVersion:         tls.VersionTLS12,
		NextProtos:         []string{"http/1.1"},
		GetConfigForClient: src.config,
	}), nil
}

// certSource holds the last good TLS configuration read from the files.
type certSource struct {
	files  TLSFiles
	logger hclog.Logger

	mu     sync.Mutex
	stamps []os.FileInfo // of CertFile, KeyFile, ClientCAFile, as last loaded
	failed []os.FileInfo // as they last failed to load (logged once)
	cfg    *tls.Config
}

func newCertSource(f TLSFiles, logger hclog.Logger) (*certSource, error) {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	if f.CertFile == "" || f.KeyFile == "" {
		return nil, fmt.Errorf("tls needs both cert_file and key_file")
	}
	s := &certSource{files: f, logger: logger.Named("tls")}
	stamps, err := s.stat()
	if err != nil {
		return nil, err
	}
	if err := s.load(stamps); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *certSource) paths() []string {
	p := []string{s.files.CertFile, s.files.KeyFile}
	if s.files.ClientCAFile != "" {
		p = append(p, s.files.ClientCAFile)
	}
	return p
}

func (s *certSource) stat() ([]os.FileInfo, error) {
	var out []os.FileInfo
	for _, p := range s.paths() {
		fi, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		out = append(out, fi)
	}
	return out, nil
}

// load reads the files into a new configuration. A key file other users
// can read is refused (its group may: Debian's ssl-cert group shares keys
// that way).
func (s *certSource) load(stamps []os.FileInfo) error {
	if perm := stamps[1].Mode().Perm(); perm&0o007 != 0 {
		return fmt.Errorf("key_file %s has mode %04o: every local user can read the key (chmod 600 %s, or 640 with a group of the role's user)",
			s.files.KeyFile, perm, s.files.KeyFile)
	}
	cert, err := tls.LoadX509KeyPair(s.files.CertFile, s.files.KeyFile)
	if err != nil {
		return fmt.Errorf("load %s and %s: %w", s.files.CertFile, s.files.KeyFile, err)
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		NextProtos:   []string{"http/1.1"},
		Certificates: []tls.Certificate{cert},
	}
	if s.files.ClientCAFile != "" {
		pem, err := os.ReadFile(s.files.ClientCAFile)
		if err != nil {
			return err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("%s holds no PEM certificate", s.files.ClientCAFile)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	s.cfg, s.stamps = cfg, stamps
	return nil
}

// config answers a handshake with the current configuration, read again
// first when a file changed.
func (s *certSource) config(*tls.ClientHelloInfo) (*tls.Config, error) {
	stamps, err := s.stat()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.logger.Warn("certificate files unreadable: serving the last good certificate", "error", err)
		return s.cfg, nil
	}
	if !sameStamps(stamps, s.stamps) && !sameStamps(stamps, s.failed) {
		if err := s.load(stamps); err != nil {
			s.failed = stamps
			s.logger.Warn("certificate files changed but do not load: serving the last good certificate", "error", err)
		} else {
			s.logger.Info("certificate reloaded", "cert_file", s.files.CertFile)
		}
	}
	return s.cfg, nil
}

func sameStamps(a, b []os.FileInfo) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].ModTime().Equal(b[i].ModTime()) || a[i].Size() != b[i].Size() || !os.SameFile(a[i], b[i]) {
			return false
		}
	}
	return true
}

// PlainListenerWarning is the warning for an inference endpoint that
// listens beyond loopback without TLS, or "".
func PlainListenerWarning(listen string, tlsOn bool) string {
	if tlsOn {
		return ""
	}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return ""
	}
	if host == "localhost" {
		return ""
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return ""
	}
	return fmt.Sprintf("the inference endpoint listens on %s without TLS: the API key and the prompts cross the network in clear "+
		"(set tls.cert_file and tls.key_file, or listen on 127.0.0.1 behind a TLS reverse proxy)", listen)
}
