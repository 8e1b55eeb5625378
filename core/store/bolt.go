// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// Package store keeps a role's durable state in one bbolt file,
// <state_dir>/capyctl.db (mode 0600). Values are JSON documents; keys are
// names, or big-endian integers where order matters.
//
// The buckets:
//
//	capyctl.db
//	├── meta
//	│   ├── schema_version ........ "5" (decimal; see migrations.go)
//	│   ├── incarnation ........... 26 base32 digits drawn when the file was created;
//	│   │                           the event cursor is "<incarnation>:<seq>"
//	│   ├── hostname .............. the machine name the state belongs to
//	│   └── <key> ................. free-form (SetMeta)
//	├── deployments
//	│   └── <name> ................ structs.DeploymentRecord (current revision)
//	├── revisions
//	│   └── <name>/ ............... one nested bucket per deployment
//	│       └── <rev u64> ......... structs.DeploymentRecord of that revision
//	├── instances
//	│   └── <deployment>/ ......... one nested bucket per deployment
//	│       └── <index u32> ....... structs.InstanceRecord
//	├── engines
//	│   └── <name> ................ structs.EngineRecord
//	├── reattach
//	│   └── <driver> .............. ReattachRecord (go-plugin reattach config)
//	├── events ................... sequence = last Seq handed out
//	│   └── <seq u64> ............. structs.Event
//	├── idempotency
//	│   └── <key> ................. IdempotencyRecord
//	├── idempotency_by_time
//	│   └── <at u64><key> ......... (empty) expiry index of idempotency
//	├── measurements
//	│   └── <key> ................. Measurement
//	├── requests ................. sequence = last request record written
//	│   └── <seq u64> ............. structs.RequestRecord
//	├── requests_by_deployment
//	│   └── <deployment>/
//	│       └── <seq u64> ......... (empty) index into requests
//	├── fleet_state
//	│   └── <key> ................. the server's replicated state, JSON per key
//	│                               (core/fleet/fsm; its log is raft's, under
//	│                               <state_dir>/raft)
//	├── responses ................ sequence = bytes of the stored responses
//	│   └── <id> .................. structs.StoredResponse (responses.go)
//	├── responses_by_time
//	│   └── <created u64><id> ..... (empty) age index of responses
//	├── api_keys
//	│   └── <name> ................ structs.APIKey: digest, scope, limits; never the key (apikeys.go)
//	├── api_key_ids
//	│   └── <public id> ........... the name of the key that carries it
//	├── api_key_use
//	│   └── <public id> ........... structs.KeyUse: this role's first and last use of the key
//	└── usage
//	    └── <hour u64><key>\x00<model>  structs.KeyUsage of one key, model and hour (apikeys.go)
//
// Events and request records are only ever removed from the oldest end, so
// their keys stay contiguous and a count is last-first+1 without a scan.
//
// Every method of Store is one transaction. Update and View hand the caller a
// Tx with the same methods so that several writes (an instance and the event
// that announces it) commit together.
package store

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capyctl/capyctl/core/structs"
	bolt "go.etcd.io/bbolt"
	boltErrors "go.etcd.io/bbolt/errors"
)

// FileName is the name of the store's file inside the state directory.
const FileName = "capyctl.db"

// Bucket names.
var (
	bucketMeta             = []byte("meta")
	bucketDeployments      = []byte("deployments")
	bucketRevisions        = []byte("revisions")
	bucketInstances        = []byte("instances")
	bucketEngines          = []byte("engines")
	bucketReattach         = []byte("reattach")
	bucketEvents           = []byte("events")
	bucketIdempotency      = []byte("idempotency")
	bucketIdempotencyTime  = []byte("idempotency_by_time")
	bucketMeasurements     = []byte("measurements")
	bucketRequests         = []byte("requests")
	bucketRequestsByDeploy = []byte("requests_by_deployment")
	// bucketFleetLog was the server's own command log (schema 2); schema
	// 4 removed it: raft's log is the one log.
	bucketFleetLog        = []byte("fleet_log")
	bucketFleetState      = []byte("fleet_state")
	bucketResponses       = []byte("responses")
	bucketResponsesByTime = []byte("responses_by_time")
	bucketAPIKeys         = []byte("api_keys")
	bucketAPIKeyIDs       = []byte("api_key_ids")
	bucketAPIKeyUse       = []byte("api_key_use")
	bucketUsage           = []byte("usage")
)

// Reserved meta keys.
const (
	MetaSchemaVersion = "schema_version"
	MetaIncarnation   = "incarnation"
	MetaHostname      = "hostname"
)

// Defaults of Options.
const (
	DefaultEventMaxCount  = 100_000
	DefaultEventMaxAge    = 7 * 24 * time.Hour
	DefaultIdempotencyTTL = 24 * time.Hour
	DefaultLockTimeout    = 2 * time.Second
	// pruneBatch bounds how many old entries one write removes, so that a
	// write never stalls behind a large clean-up; the rest goes with the
	// following writes.
	pruneBatch = 512
)

// Options tune a Store. The zero value gives the defaults.
type Options struct {
	// Now is the clock (events' At, retention); time.Now when nil.
	Now func() time.Time
	// EventMaxCount bounds the event journal (default 100 000).
	EventMaxCount int
	// EventMaxAge bounds the age of events (default 7 days).
	EventMaxAge time.Duration
	// IdempotencyTTL is how long an idempotency key is remembered
	// (default 24 h).
	IdempotencyTTL time.Duration
	// LockTimeout is how long Open waits for another process holding the
	// file (default 2 s).
	LockTimeout time.Duration
}

func (o Options) withDefaults() Options {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.EventMaxCount <= 0 {
		o.EventMaxCount = DefaultEventMaxCount
	}
	if o.EventMaxAge <= 0 {
		o.EventMaxAge = DefaultEventMaxAge
	}
	if o.IdempotencyTTL <= 0 {
		o.IdempotencyTTL = DefaultIdempotencyTTL
	}
	if o.LockTimeout <= 0 {
		o.LockTimeout = DefaultLockTimeout
	}
	return o
}

// Store is the open state database. It is safe for concurrent use; bbolt
// runs one writer at a time and readers beside it.
type Store struct {
	db          *bolt.DB
	opts        Options
	incarnation string

	subMu    sync.Mutex
	subs     map[*subscriber]struct{}
	notified uint64
	closed   bool

	// commits counts committed read-write transactions (the request
	// writer's tests assert its group commit with it).
	commits atomic.Uint64

	// requestTail is the request ledger's writer, whose journal
	// ListRequests reads beside the store (nil: no writer, or it is off).
	requestTail atomic.Pointer[RequestWriter]
}

// Commits is how many read-write transactions committed since the store
// opened (each one a synced write: tests count a caller's writes).
func (s *Store) Commits() uint64 { return s.commits.Load() }

// PathIn returns the store's path inside a state directory.
func PathIn(stateDir string) string { return filepath.Join(stateDir, FileName) }

// Open opens (creating if needed) the store at path, migrating an older
// schema forward. A file written by a newer binary is refused with
// store_from_newer_version. The parent directory is created 0700.
func Open(path string, opts Options) (*Store, error) {
	return openWith(path, opts, migrations)
}

func openWith(path string, opts Options, migs []migration) (*Store, error) {
	opts = opts.withDefaults()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: opts.LockTimeout, FreelistType: bolt.FreelistMapType})
	if err != nil {
		if errors.Is(err, boltErrors.ErrTimeout) {
			return nil, fmt.Errorf("open store %s: another process holds it: %w", path, err)
		}
		if structs.StorageRefused(err) {
			return nil, structs.Wrap(structs.CodeStoreUnavailable, err, "open store %s", path)
		}
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	// IMPORTANT: the file holds launch keys; keep it owner-only even when it
	// was created by an older binary or copied in with a looser mode.
	if err := os.Chmod(path, 0o600); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open store: %w", err)
	}
	if err := migrate(db, migs); err != nil {
		_ = db.Close()
		return nil, err
	}
	s := &Store{db: db, opts: opts, subs: map[*subscriber]struct{}{}}
	err = db.View(func(tx *bolt.Tx) error {
		s.incarnation = string(tx.Bucket(bucketMeta).Get([]byte(MetaIncarnation)))
		return nil
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open store: %w", err)
	}
	return s, nil
}

// Close closes the file and ends every subscription. A second Close does
// nothing.
func (s *Store) Close() error {
	s.subMu.Lock()
	if s.closed {
		s.subMu.Unlock()
		return nil
	}
	s.closed = true
	for sub := range s.subs {
		close(sub.ch)
		delete(s.subs, sub)
	}
	s.subMu.Unlock()
	return s.db.Close()
}

// Path returns the file's path.
func (s *Store) Path() string { return s.db.Path() }

// Incarnation returns the random ID drawn when the file was created. An
// event cursor from another incarnation is meaningless here.
func (s *Store) Incarnation() string { return s.incarnation }

// SchemaVersion returns the file's schema version.
func (s *Store) SchemaVersion() (int, error) {
	v, err := s.Meta(MetaSchemaVersion)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(v)
}

// Tx is one transaction. Its methods are those of Store; in a read-only
// transaction (View) the writing ones fail.
type Tx struct {
	tx *bolt.Tx
	s  *Store
	// lastEvent is the highest Seq appended in this transaction; the
	// subscribers learn of it once the transaction commits.
	lastEvent uint64
}

// Update runs fn in a read-write transaction: everything fn writes commits
// together, or nothing does when fn returns an error. IMPORTANT: fn uses
// tx's methods only; calling the Store from inside fn deadlocks (bbolt has
// one writer).
func (s *Store) Update(fn func(tx *Tx) error) error {
	return diskErr(s.db.Update(func(btx *bolt.Tx) error {
		t := &Tx{tx: btx, s: s}
		if err := fn(t); err != nil {
			return err
		}
		btx.OnCommit(func() { s.commits.Add(1) })
		if t.lastEvent > 0 {
			seq := t.lastEvent
			btx.OnCommit(func() { s.notify(seq) })
		}
		return nil
	}))
}

// diskErr codes a write the file system refused (a full disk, a read-only
// or immutable file or file system, a failing device) store_unavailable:
// the operator frees room or restores the file, and the same call then
// succeeds. Other errors (fn's own refusals) pass unchanged.
func diskErr(err error) error {
	if err == nil || !structs.StorageRefused(err) {
		return err
	}
	return structs.Wrap(structs.CodeStoreUnavailable, err, "write the state store")
}

// View runs fn in a read-only transaction: a consistent snapshot.
func (s *Store) View(fn func(tx *Tx) error) error {
	return s.db.View(func(btx *bolt.Tx) error { return fn(&Tx{tx: btx, s: s}) })
}

// Meta returns a meta value, or not_found.
func (s *Store) Meta(key string) (string, error) {
	var v string
	err := s.View(func(tx *Tx) error {
		var err error
		v, err = tx.Meta(key)
		return err
	})
	return v, err
}

// SetMeta sets a meta value. The schema version and the incarnation are
// the store's own and refused.
func (s *Store) SetMeta(key, value string) error {
	return s.Update(func(tx *Tx) error { return tx.SetMeta(key, value) })
}

// Meta returns a meta value, or not_found.
func (t *Tx) Meta(key string) (string, error) {
	v := t.tx.Bucket(bucketMeta).Get([]byte(key))
	if v == nil {
		return "", notFound("meta key %q", key)
	}
	return string(v), nil
}

// SetMeta sets a meta value (see Store.SetMeta).
func (t *Tx) SetMeta(key, value string) error {
	if key == "" {
		return fmt.Errorf("set meta: empty key")
	}
	if key == MetaSchemaVersion || key == MetaIncarnation {
		return fmt.Errorf("set meta: %s is managed by the store", key)
	}
	return t.tx.Bucket(bucketMeta).Put([]byte(key), []byte(value))
}

// PinHostname records name as the state's hostname on first use; later it
// refuses a different name with host_name_changed, since the state (ports,
// process identities, engines) belongs to the machine that wrote it. In a
// container, pin the hostname (docker run --hostname <stored name>).
func (s *Store) PinHostname(name string) error {
	return s.Update(func(tx *Tx) error {
		stored, err := tx.Meta(MetaHostname)
		if structs.HasCode(err, structs.CodeNotFound) || stored == "" {
			return tx.SetMeta(MetaHostname, name)
		}
		if stored != name {
			return structs.Errf(structs.CodeHostNameChanged,
				"the state in %s was written on host %q, this machine is %q; run it with the stored name (docker run --hostname %s)",
				s.Path(), stored, name, stored).
				WithDetail("stored", stored).WithDetail("current", name)
		}
		return nil
	})
}

// crockford is Crockford's base32 alphabet (ULID's).
const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

// newIncarnation draws 128 random bits, written as 26 Crockford base32
// digits so that a cursor "<incarnation>:<seq>" fits in 46 bytes.
func newIncarnation() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("draw incarnation: %w", err)
	}
	hi, lo := binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
	out := make([]byte, 26)
	for i := 25; i >= 0; i-- {
		out[i] = crockford[lo&31]
		lo = lo>>5 | hi<<59
		hi >>= 5
	}
	return string(out), nil
}

func notFound(format string, args ...any) error {
	return structs.Errf(structs.CodeNotFound, format, args...)
}

func u64(v uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return b[:]
}

func readU64(b []byte) uint64 {
	if len(b) < 8 {
		return 0
	}
	return binary.BigEndian.Uint64(b[:8])
}

func u32(v uint32) []byte {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return b[:]
}

func putJSON(b *bolt.Bucket, key []byte, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s: %w", key, err)
	}
	return b.Put(key, data)
}

func getJSON(b *bolt.Bucket, key []byte, v any) (bool, error) {
	if b == nil {
		return false, nil
	}
	data := b.Get(key)
	if data == nil {
		return false, nil
	}
	if err := json.Unmarshal(data, v); err != nil {
		return true, fmt.Errorf("decode %s: %w", key, err)
	}
	return true, nil
}

// bucket returns a top-level bucket; every one exists after migration.
func (t *Tx) bucket(name []byte) *bolt.Bucket { return t.tx.Bucket(name) }

func jsonUnmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
