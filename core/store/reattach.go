// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// ReattachRecord is what a restarted core needs to reconnect to a driver
// process a previous core launched (go-plugin's ReattachConfig), plus the
// process's start time so that a recycled PID is never mistaken for it.
type ReattachRecord struct {
	Driver          string    `json:"driver"`
	Network         string    `json:"network"`
	Addr            string    `json:"addr"`
	Pid             int       `json:"pid"`
	StartTicks      uint64    `json:"start_ticks"`
	ProtocolVersion int       `json:"protocol_version"`
	Program         string    `json:"program"`
	UpdatedAt       time.Time `json:"updated_at"`
	// TLS is the driver connection's mutual-TLS material: the core's client
	// certificate and key and the driver's server certificate. It is a
	// secret (whoever holds the key can drive the driver), kept only in
	// this owner-only file; nil for a driver launched without TLS.
	TLS *DriverTLS `json:"tls,omitempty"`
}

// DriverTLS is the material a re-attaching core needs to speak mutual TLS
// to a running driver (go-plugin's ReattachConfig has no place for it).
type DriverTLS struct {
	// ClientCertPEM and ClientKeyPEM are the core's certificate (the one
	// the driver was given in PLUGIN_CLIENT_CERT) and its private key.
	ClientCertPEM []byte `json:"client_cert_pem"`
	ClientKeyPEM  []byte `json:"client_key_pem"`
	// ServerCertDER is the certificate the driver answered with at launch.
	ServerCertDER []byte `json:"server_cert_der"`
}

// PutReattach stores the reattach config of a driver.
func (s *Store) PutReattach(driver string, r ReattachRecord) error {
	return s.Update(func(tx *Tx) error { return tx.PutReattach(driver, r) })
}

// GetReattach returns the reattach config of a driver, or not_found.
func (s *Store) GetReattach(driver string) (*ReattachRecord, error) {
	return view(s, func(tx *Tx) (*ReattachRecord, error) { return tx.GetReattach(driver) })
}

// DeleteReattach forgets a driver's reattach config, or answers not_found.
func (s *Store) DeleteReattach(driver string) error {
	return s.Update(func(tx *Tx) error { return tx.DeleteReattach(driver) })
}

// ListReattach returns every recorded driver, by driver name.
func (s *Store) ListReattach() ([]ReattachRecord, error) {
	return view(s, (*Tx).ListReattach)
}

// PutReattach is Store.PutReattach inside a transaction.
func (t *Tx) PutReattach(driver string, r ReattachRecord) error {
	if driver == "" {
		return fmt.Errorf("put reattach: empty driver name")
	}
	if r.Driver == "" {
		r.Driver = driver
	}
	if err := putJSON(t.bucket(bucketReattach), []byte(driver), r); err != nil {
		return fmt.Errorf("put reattach %s: %w", driver, err)
	}
	return nil
}

// GetReattach is Store.GetReattach inside a transaction.
func (t *Tx) GetReattach(driver string) (*ReattachRecord, error) {
	var r ReattachRecord
	ok, err := getJSON(t.bucket(bucketReattach), []byte(driver), &r)
	if err != nil {
		return nil, fmt.Errorf("get reattach %s: %w", driver, err)
	}
	if !ok {
		return nil, notFound("no reattach config for driver %q", driver)
	}
	return &r, nil
}

// DeleteReattach is Store.DeleteReattach inside a transaction.
func (t *Tx) DeleteReattach(driver string) error {
	return deleteKey(t.bucket(bucketReattach), []byte(driver), "reattach config for driver")
}

// ListReattach is Store.ListReattach inside a transaction.
func (t *Tx) ListReattach() ([]ReattachRecord, error) {
	return listJSON[ReattachRecord](t.bucket(bucketReattach), "reattach configs")
}

// deleteKey removes a key, answering not_found when it is absent.
func deleteKey(b *bolt.Bucket, key []byte, what string) error {
	if b.Get(key) == nil {
		return notFound("no %s %q", what, key)
	}
	if err := b.Delete(key); err != nil {
		return fmt.Errorf("delete %s %s: %w", what, key, err)
	}
	return nil
}
