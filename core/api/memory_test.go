// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/ledger"
	"github.com/capyctl/capyctl/core/placement"
	"github.com/capyctl/capyctl/core/router"
	"github.com/capyctl/capyctl/core/store"
)

// jsonOf is a value's JSON as a generic object, so key order does not
// matter.
func jsonOf(t *testing.T, v any) any {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

var (
	testDomains = []ledger.DomainState{
		{Domain: ledger.Domain{Name: "system", Kind: ledger.KindSystem, Capacity: 64 << 30, ManagedLimit: 48 << 30, FreeReserve: 1 << 30},
			Room: 48 << 30, Charged: 1 << 30, Free: 47 << 30},
		{Domain: ledger.Domain{Name: "gpu0", Kind: ledger.KindDevice, DeviceUUID: "GPU-a", DeviceName: "H200", Capacity: 141 << 30,
			ManagedLimit: 140 << 30, FreeReserve: 1 << 30, External: 2 << 30}, Room: 139 << 30, Charged: 10 << 30, Free: 129 << 30},
	}
	testOwners = []ledger.OwnerState{{ID: "a/0", Phase: ledger.PhaseReady, Charges: map[string]int64{"gpu0": 10 << 30},
		Plan: map[string]map[string]int64{ledger.PhaseReady: {"gpu0": 10 << 30}}}}
)

// TestMemoryView_SameJSON: the wire types the API builds answer exactly
// the JSON the domain values marshalled to before the views moved to
// core/api/wire (the ledger's and the store's types keep their tags, so
// they are the reference).
func TestMemoryView_SameJSON(t *testing.T) {
	m := &store.Measurement{DeviceBytes: 6 << 30, HostBytes: 64 << 20, Provenance: ledger.ProvMeasured,
		At: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC), Samples: 7}
	if got, want := jsonOf(t, measurement(m)), jsonOf(t, m); !reflect.DeepEqual(got, want) {
		t.Errorf("measurement:\n got %v\nwant %v", got, want)
	}
	if got, want := jsonOf(t, ledgerDomains(testDomains)), jsonOf(t, testDomains); !reflect.DeepEqual(got, want) {
		t.Errorf("ledger domains:\n got %v\nwant %v", got, want)
	}
	snap := ledger.Snapshot{Epoch: 9, Domains: testDomains, Owners: testOwners}
	lv := toMap(ledgerView(placement.HostState{GPUKind: "fake", Ledger: snap}))
	want := jsonOf(t, snap).(map[string]any)
	want["gpu_provider"] = "fake"
	if !reflect.DeepEqual(lv, want) {
		t.Errorf("ledger view:\n got %v\nwant %v", lv, want)
	}
	// An empty ledger reads null, not [].
	if lv := toMap(ledgerView(placement.HostState{GPUKind: "none"})); lv["domains"] != nil || lv["owners"] != nil {
		t.Errorf("empty ledger view = %v", lv)
	}

	mem := placement.DeploymentMemory{
		Host: "h", Domain: "gpu0",
		Startup: placement.StartupCharge{DeviceBytes: 4 << 30, HostBytes: 1 << 30, DeviceProvenance: "placeholder", HostProvenance: "declared",
			ObservedDeviceBytes: 6 << 30, ObservedHostBytes: 64 << 20, ObservedSamples: 3},
		Ready:   placement.PhaseCharge{DeviceBytes: 3 << 30, HostBytes: 1 << 30, Provenance: "derived"},
		Parked:  placement.PhaseCharge{DeviceBytes: 1 << 30},
		KVCache: 2 << 30, Weights: 1 << 30, Measured: m, Ledger: testDomains,
	}
	got := toMap(memoryView(mem))
	wantMem := map[string]any{
		"host": "h", "domain": "gpu0",
		"startup": map[string]any{"device_bytes": float64(4 << 30), "host_bytes": float64(1 << 30), "device_provenance": "placeholder",
			"host_provenance": "declared", "observed_device_bytes": float64(6 << 30), "observed_host_bytes": float64(64 << 20), "observed_samples": float64(3)},
		"ready":          map[string]any{"device_bytes": float64(3 << 30), "host_bytes": float64(1 << 30), "provenance": "derived"},
		"parked":         map[string]any{"device_bytes": float64(1 << 30), "host_bytes": float64(0)},
		"kv_cache_bytes": float64(2 << 30), "weights_bytes": float64(1 << 30),
		"measured": jsonOf(t, m), "ledger": jsonOf(t, testDomains),
	}
	if !reflect.DeepEqual(got, wantMem) {
		t.Errorf("memory view:\n got %v\nwant %v", got, wantMem)
	}
	// Without a placement: no domain, no figures, no measurement, and the
	// ledger null when it has no domain.
	got = toMap(memoryView(placement.DeploymentMemory{Host: "h"}))
	for _, k := range []string{"domain", "kv_cache_bytes", "weights_bytes", "measured"} {
		if _, ok := got[k]; ok {
			t.Errorf("an empty memory view has %q: %v", k, got)
		}
	}
	if v, ok := got["ledger"]; !ok || v != nil {
		t.Errorf("an empty memory view's ledger = %v (present %v), want null", v, ok)
	}
}

// TestLoadViews_SameJSON: the load view's wire types answer the JSON the
// router's values marshal to (built from JSON here, so the test names no
// type of the router's or the lifecycle's).
func TestLoadViews_SameJSON(t *testing.T) {
	src := `[{"deployment":"a","requests":{"places":4,"max_waiting":16,"waiting":2,"in_flight":3,"settle_when_idle":5,
	  "settle_at_stop":6,"settle_on_abort":7,"instances":[{"id":"a/0","generation":2,"ready":true,"in_flight":8,
	  "settle_when_idle":9,"settle_at_stop":10,"settle_on_abort":11}]},
	  "engines":{"a/0":{"known":true,"running":3,"waiting":1,"kv_usage":0.25,"figures":{"tokens_per_second":12.5},"at":"2025-01-02T03:04:05Z"}}},
	 {"deployment":"b","requests":{"places":1,"max_waiting":0,"waiting":0,"in_flight":0,"settle_when_idle":0,"settle_at_stop":0,"settle_on_abort":0}}]`
	var loads []router.DeploymentLoad
	if err := json.Unmarshal([]byte(src), &loads); err != nil {
		t.Fatal(err)
	}
	if got, want := jsonOf(t, loadViews(loads)), jsonOf(t, loads); !reflect.DeepEqual(got, want) {
		t.Errorf("load view:\n got %v\nwant %v", got, want)
	}
	if got := jsonOf(t, loadViews(nil)); !reflect.DeepEqual(got, []any{}) {
		t.Errorf("no deployment: %v, want []", got)
	}
}
