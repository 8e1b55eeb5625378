// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"fmt"
	"strconv"

	"github.com/capyctl/capyctl/core/structs"
	bolt "go.etcd.io/bbolt"
)

// migration moves the file from schema version-1 to version. Migrations run
// forward only, in order, all in one transaction with the version bump.
type migration struct {
	version int
	name    string
	apply   func(tx *bolt.Tx) error
}

// migrations is the schema's history. IMPORTANT: append only; never edit or
// renumber a released migration (old files on operators' disks replay
// them), and keep a database file of each version under testdata/ with a
// test that opens it.
var migrations = []migration{
	{version: 1, name: "initial buckets", apply: migrateV1},
	{version: 2, name: "the server's command log and state (several machines)", apply: migrateV2},
	{version: 3, name: "the Responses API's stored responses", apply: migrateV3},
	{version: 4, name: "the server's command log goes: raft's log is the one log", apply: migrateV4},
	{version: 5, name: "named API keys and their usage", apply: migrateV5},
}

// CurrentSchemaVersion is the schema this binary writes.
func CurrentSchemaVersion() int { return migrations[len(migrations)-1].version }

func migrateV1(tx *bolt.Tx) error {
	for _, name := range [][]byte{
		bucketMeta, bucketDeployments, bucketRevisions, bucketInstances, bucketEngines,
		bucketReattach, bucketEvents, bucketIdempotency, bucketIdempotencyTime,
		bucketMeasurements, bucketRequests, bucketRequestsByDeploy,
	} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	return nil
}

func migrateV2(tx *bolt.Tx) error {
	for _, name := range [][]byte{bucketFleetLog, bucketFleetState} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	return nil
}

// migrateV4 drops fleet_log: every server runs raft (a server alone is a
// cluster of one voter), whose log is the one durable log of commands;
// the state they built stays in fleet_state.
func migrateV4(tx *bolt.Tx) error {
	if tx.Bucket(bucketFleetLog) == nil {
		return nil
	}
	if err := tx.DeleteBucket(bucketFleetLog); err != nil {
		return fmt.Errorf("delete bucket %s: %w", bucketFleetLog, err)
	}
	return nil
}

// migrate brings the file to the last version of migs. A new file gets its
// incarnation here.
func migrate(db *bolt.DB, migs []migration) error {
	target := migs[len(migs)-1].version
	return db.Update(func(tx *bolt.Tx) error {
		current := 0
		if meta := tx.Bucket(bucketMeta); meta != nil {
			if raw := meta.Get([]byte(MetaSchemaVersion)); raw != nil {
				v, err := strconv.Atoi(string(raw))
				if err != nil || v < 0 {
					return fmt.Errorf("store schema version %q does not parse", raw)
				}
				current = v
			}
		}
		if current > target {
			return structs.Errf(structs.CodeStoreFromNewerVersion,
				"the store %s has schema version %d, newer than this binary's %d; run the newer capyctl or restore a backup",
				db.Path(), current, target).
				WithDetail("schema_version", current).WithDetail("supported", target)
		}
		for _, m := range migs {
			if m.version <= current {
				continue
			}
			if err := m.apply(tx); err != nil {
				return fmt.Errorf("migrate store to version %d (%s): %w", m.version, m.name, err)
			}
		}
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return fmt.Errorf("migrate store: %w", err)
		}
		if meta.Get([]byte(MetaIncarnation)) == nil {
			inc, err := newIncarnation()
			if err != nil {
				return err
			}
			if err := meta.Put([]byte(MetaIncarnation), []byte(inc)); err != nil {
				return fmt.Errorf("migrate store: %w", err)
			}
		}
		if current != target {
			if err := meta.Put([]byte(MetaSchemaVersion), []byte(strconv.Itoa(target))); err != nil {
				return fmt.Errorf("migrate store: %w", err)
			}
		}
		return nil
	})
}
