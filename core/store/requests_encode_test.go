// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package store

import (
	"encoding/json"
	"math"
	"math/rand"
	"reflect"
	"testing"
	"time"

	"github.com/capyctl/capyctl/core/structs"
)

// randomRecord fills every field of a RequestRecord by reflection (so that a
// field added to the struct is filled too), each left at its zero value one
// time in four.
func randomRecord(rng *rand.Rand) structs.RequestRecord {
	strs := []string{"", "demo", "capy-0123456789abcdef01234567", "a<b>&c", "quote\"back\\slash", "tab\tnew\nline\b\f\x01",
		"ünïcödé 模型", "line\u2028sep", "bad\xffutf8", "key-name_1"}
	floats := []float64{0, 12.5, 0.001, 1e-7, 3e21, 123456.789, 1.0 / 3, -2.25, 1e20, 5e-324}
	var r structs.RequestRecord
	v := reflect.ValueOf(&r).Elem()
	for i := 0; i < v.NumField(); i++ {
		if rng.Intn(4) == 0 {
			continue
		}
		f := v.Field(i)
		switch f.Kind() {
		case reflect.String:
			f.SetString(strs[rng.Intn(len(strs))])
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Int, reflect.Int64:
			f.SetInt(rng.Int63n(1<<40) - 1<<20)
		case reflect.Float64:
			f.SetFloat(floats[rng.Intn(len(floats))])
		case reflect.Struct:
			at := time.Unix(rng.Int63n(4e9), rng.Int63n(1e9))
			if rng.Intn(2) == 0 {
				at = at.In(time.FixedZone("x", 3600*rng.Intn(12)))
			} else {
				at = at.UTC()
			}
			f.Set(reflect.ValueOf(at))
		default:
			panic("randomRecord: a field of kind " + f.Kind().String() + " is not filled")
		}
	}
	return r
}

// TestAppendRecord_IsJSONMarshal: the ledger's encoder writes what
// json.Marshal writes, for records with every field set or left empty,
// strings that need escaping and numbers encoding/json writes with an
// exponent; and fails where json.Marshal fails.
func TestAppendRecord_IsJSONMarshal(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	recs := []structs.RequestRecord{{}}
	for i := 0; i < 5000; i++ {
		recs = append(recs, randomRecord(rng))
	}
	for _, r := range recs {
		want, err := json.Marshal(&r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := appendRecord(nil, &r)
		if err != nil || string(got) != string(want) {
			t.Fatalf("appendRecord(%+v) =\n%s (%v), json.Marshal:\n%s", r, got, err, want)
		}
	}
	for _, bad := range []structs.RequestRecord{{TotalMs: math.NaN()}, {QueueMs: math.Inf(1)}, {ReceivedAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}} {
		if _, err := appendRecord(nil, &bad); err == nil {
			t.Errorf("appendRecord(%+v) did not fail; json.Marshal does", bad)
		}
	}
}

func BenchmarkAppendRecord(b *testing.B) {
	r := structs.RequestRecord{ID: "capy-cfc35db792e61a3842220ea5", Deployment: "demo", Instance: "demo/0", API: "chat",
		Outcome: "completed", Status: 200, ReceivedAt: time.Now().UTC(), TotalMs: 12.5, TTFBMs: 3.2, BytesIn: 180,
		BytesOut: 900, PromptTokens: 12, CompletionToks: 8, Key: "default"}
	b.Run("appendRecord", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for i := 0; i < b.N; i++ {
			buf, _ = appendRecord(buf[:0], &r)
		}
	})
	b.Run("json.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			_, _ = json.Marshal(&r)
		}
	})
}
