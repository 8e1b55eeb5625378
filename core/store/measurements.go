// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"bytes"
	"fmt"
	"time"
)

// Measurement is a memory figure measured from an engine's own processes:
// a startup peak or a parked residue. Keys are the caller's (for example
// "startup/<deployment>/<revision>/<host>/<device>"); merging a new reading
// with the stored one (MAX) is the caller's job too.
type Measurement struct {
	DeviceBytes int64 `json:"device_bytes"`
	HostBytes   int64 `json:"host_bytes"`
	// Provenance is "measured", "declared", "derived" or "placeholder".
	Provenance string    `json:"provenance"`
	At         time.Time `json:"at"`
	// Samples counts the readings merged into this one.
	Samples int `json:"samples"`
}

// PutMeasurement stores a measurement under key.
func (s *Store) PutMeasurement(key string, m Measurement) error {
	return s.Update(func(tx *Tx) error { return tx.PutMeasurement(key, m) })
}

// GetMeasurement returns a measurement, or not_found.
func (s *Store) GetMeasurement(key string) (*Measurement, error) {
	return view(s, func(tx *Tx) (*Measurement, error) { return tx.GetMeasurement(key) })
}

// DeleteMeasurement removes a measurement, or answers not_found.
func (s *Store) DeleteMeasurement(key string) error {
	return s.Update(func(tx *Tx) error { return tx.DeleteMeasurement(key) })
}

// ListMeasurements returns the measurements whose key starts with prefix,
// by key ("" lists all).
func (s *Store) ListMeasurements(prefix string) (map[string]Measurement, error) {
	return view(s, func(tx *Tx) (map[string]Measurement, error) { return tx.ListMeasurements(prefix) })
}

// PutMeasurement is Store.PutMeasurement inside a transaction.
func (t *Tx) PutMeasurement(key string, m Measurement) error {
	if key == "" {
		return fmt.Errorf("put measurement: empty key")
	}
	if err := putJSON(t.bucket(bucketMeasurements), []byte(key), m); err != nil {
		return fmt.Errorf("put measurement %s: %w", key, err)
	}
	return nil
}

// GetMeasurement is Store.GetMeasurement inside a transaction.
func (t *Tx) GetMeasurement(key string) (*Measurement, error) {
	var m Measurement
	ok, err := getJSON(t.bucket(bucketMeasurements), []byte(key), &m)
	if err != nil {
		return nil, fmt.Errorf("get measurement %s: %w", key, err)
	}
	if !ok {
		return nil, notFound("no measurement %q", key)
	}
	return &m, nil
}

// DeleteMeasurement is Store.DeleteMeasurement inside a transaction.
func (t *Tx) DeleteMeasurement(key string) error {
	return deleteKey(t.bucket(bucketMeasurements), []byte(key), "measurement")
}

// ListMeasurements is Store.ListMeasurements inside a transaction.
func (t *Tx) ListMeasurements(prefix string) (map[string]Measurement, error) {
	out := map[string]Measurement{}
	c := t.bucket(bucketMeasurements).Cursor()
	p := []byte(prefix)
	for k, v := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, v = c.Next() {
		var m Measurement
		if err := jsonUnmarshal(v, &m); err != nil {
			return nil, fmt.Errorf("decode measurement %s: %w", k, err)
		}
		out[string(k)] = m
	}
	return out, nil
}
