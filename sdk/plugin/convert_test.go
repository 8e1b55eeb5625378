// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/capyctl/capyctl/sdk"
	pb "github.com/capyctl/capyctl/sdk/proto/driverv1"
)

// conversion is one message's pair of conversions, checked both ways.
type conversion struct {
	name string
	// goRoundTrip fills every field of the Go type, converts it to the
	// protobuf message and back, and returns both Go values.
	goRoundTrip func(n *int) (in, out any)
	// pbRoundTrip fills every field of the protobuf message, converts it to
	// the Go type and back, and returns both messages.
	pbRoundTrip func(n *int) (in, out proto.Message)
	goFields    int
}

func convCase[G any, P proto.Message](name string, toPB func(*G) P, fromPB func(P) G) conversion {
	return conversion{
		name: name,
		goRoundTrip: func(n *int) (any, any) {
			var in G
			fillGo(reflect.ValueOf(&in).Elem(), n)
			out := fromPB(toPB(&in))
			return in, out
		},
		pbRoundTrip: func(n *int) (proto.Message, proto.Message) {
			var g G
			in := reflect.New(reflect.TypeFor[P]().Elem()).Interface().(P)
			fillPB(in.ProtoReflect(), n)
			g = fromPB(in)
			return in, toPB(&g)
		},
		goFields: reflect.TypeFor[G]().NumField(),
	}
}

// conversions lists every message of the protocol.
func conversions() []conversion {
	return []conversion{
		convCase("DescribeRequest", describeRequestToPB, describeRequestFromPB),
		convCase("DescribeResponse", describeResponseToPB, describeResponseFromPB),
		convCase("Capabilities", capabilitiesToPB, capabilitiesFromPB),
		convCase("DetectRequest", detectRequestToPB, detectRequestFromPB),
		convCase("DetectResponse", detectResponseToPB, detectResponseFromPB),
		convCase("FlagsRequest", flagsRequestToPB, flagsRequestFromPB),
		convCase("FlagRule", flagRuleToPB, flagRuleFromPB),
		convCase("FlagsResponse", flagsResponseToPB, flagsResponseFromPB),
		convCase("Installation", installationToPB, installationFromPB),
		convCase("HostPolicy", hostPolicyToPB, hostPolicyFromPB),
		convCase("Deployment", deploymentToPB, deploymentFromPB),
		convCase("Group", groupToPB, groupFromPB),
		convCase("Resources", resourcesToPB, resourcesFromPB),
		convCase("MemorySizes", memorySizesToPB, memorySizesFromPB),
		convCase("LaunchContext", launchContextToPB, launchContextFromPB),
		convCase("PlanRequest", planRequestToPB, planRequestFromPB),
		convCase("Refusal", refusalToPB, refusalFromPB),
		convCase("MemoryHints", memoryHintsToPB, memoryHintsFromPB),
		convCase("Parsers", parsersToPB, parsersFromPB),
		convCase("PlanResponse", planResponseToPB, planResponseFromPB),
		convCase("LMCachePlan", lMCachePlanToPB, lMCachePlanFromPB),
		convCase("StartRequest", startRequestToPB, startRequestFromPB),
		convCase("ProcessIdentity", processIdentityToPB, processIdentityFromPB),
		convCase("Launch", launchToPB, launchFromPB),
		convCase("Endpoint", endpointToPB, endpointFromPB),
		convCase("StartResponse", startResponseToPB, startResponseFromPB),
		convCase("ProbeRequest", probeRequestToPB, probeRequestFromPB),
		convCase("ProbeResponse", probeResponseToPB, probeResponseFromPB),
		convCase("ParkRequest", parkRequestToPB, parkRequestFromPB),
		convCase("ParkResponse", parkResponseToPB, parkResponseFromPB),
		convCase("WakeRequest", wakeRequestToPB, wakeRequestFromPB),
		convCase("WakeResponse", wakeResponseToPB, wakeResponseFromPB),
		convCase("AbortRequest", abortRequestToPB, abortRequestFromPB),
		convCase("AbortResponse", abortResponseToPB, abortResponseFromPB),
		convCase("LoadRequest", loadRequestToPB, loadRequestFromPB),
		convCase("LoadResponse", loadResponseToPB, loadResponseFromPB),
		convCase("StopRequest", stopRequestToPB, stopRequestFromPB),
		convCase("StopResponse", stopResponseToPB, stopResponseFromPB),
		convCase("RecoverRequest", recoverRequestToPB, recoverRequestFromPB),
		convCase("RecoverResponse", recoverResponseToPB, recoverResponseFromPB),
		convCase("LogsRequest", logsRequestToPB, logsRequestFromPB),
		convCase("LogsResponse", logsResponseToPB, logsResponseFromPB),
		convCase("WaitExitRequest", waitExitRequestToPB, waitExitRequestFromPB),
		convCase("ExitEvent", exitEventToPB, exitEventFromPB),
	}
}

// TestConvert_RoundTrip fills every field of every message, in its Go form
// and in its protobuf form, converts it to the other form and back, and
// compares: a field the conversion forgets (or puts in another field)
// comes back zero or different.
func TestConvert_RoundTrip(t *testing.T) {
	for _, c := range conversions() {
		t.Run(c.name, func(t *testing.T) {
			n := 0
			in, out := c.goRoundTrip(&n)
			if !reflect.DeepEqual(in, out) {
				t.Errorf("Go -> protobuf -> Go changed %s", goDiff(reflect.ValueOf(in), reflect.ValueOf(out), c.name))
			}
			n = 0
			pin, pout := c.pbRoundTrip(&n)
			if !proto.Equal(pin, pout) {
				t.Errorf("protobuf -> Go -> protobuf changed %s", pbDiff(pin.ProtoReflect(), pout.ProtoReflect(), c.name))
			}
			if want := pin.ProtoReflect().Descriptor().Fields().Len(); c.goFields != want {
				t.Errorf("the Go type has %d fields, the message %d", c.goFields, want)
			}
		})
	}
}

// TestConvert_EveryMessage keeps the table complete: every message of
// driver.proto has its conversion.
func TestConvert_EveryMessage(t *testing.T) {
	have := map[string]bool{}
	for _, c := range conversions() {
		have[c.name] = true
	}
	msgs := pb.File_sdk_proto_driverv1_driver_proto.Messages()
	for i := range msgs.Len() {
		if name := string(msgs.Get(i).Name()); !have[name] {
			t.Errorf("message %s has no conversion in the table (and maybe none in convert.go)", name)
		}
	}
	if len(have) != msgs.Len() {
		t.Errorf("%d conversions for %d messages", len(have), msgs.Len())
	}
}

// TestConvert_Enums: each Go enum has the protocol's numbers and names.
func TestConvert_Enums(t *testing.T) {
	names := map[string]func(int32) string{
		"AbortMode":         func(n int32) string { return sdk.AbortMode(n).String() },
		"NonStreamedHangup": func(n int32) string { return sdk.NonStreamedHangup(n).String() },
		"FlagClass":         func(n int32) string { return sdk.FlagClass(n).String() },
		"FlagKind":          func(n int32) string { return sdk.FlagKind(n).String() },
		"ProbeKind":         func(n int32) string { return sdk.ProbeKind(n).String() },
		"RecoverState":      func(n int32) string { return sdk.RecoverState(n).String() },
	}
	enums := pb.File_sdk_proto_driverv1_driver_proto.Enums()
	if enums.Len() != len(names) {
		t.Fatalf("%d enums in driver.proto, %d Go enums", enums.Len(), len(names))
	}
	for i := range enums.Len() {
		e := enums.Get(i)
		name, ok := names[string(e.Name())]
		if !ok {
			t.Errorf("enum %s has no Go type", e.Name())
			continue
		}
		for j := range e.Values().Len() {
			v := e.Values().Get(j)
			if got := name(int32(v.Number())); got != string(v.Name()) {
				t.Errorf("%s %d: Go says %q, driver.proto %q", e.Name(), v.Number(), got, v.Name())
			}
		}
	}
}

// TestConvert_ZeroIsAbsent: a message the Go type holds by value goes as an
// absent message when zero (what the core sent for an unset one), and an
// absent message comes back as the zero value; one held by pointer stays
// nil both ways.
func TestConvert_ZeroIsAbsent(t *testing.T) {
	p := startRequestToPB(&sdk.StartRequest{EngineKey: "k"})
	if p.Deployment != nil || p.Launch != nil || p.Plan != nil || p.Installation != nil || p.Host != nil {
		t.Fatalf("zero messages sent as present: %v", p)
	}
	g := startResponseFromPB(&pb.StartResponse{})
	if g.LMCacheServer != nil || !reflect.ValueOf(g.Launch).IsZero() {
		t.Fatalf("absent messages read as %+v", g)
	}
	if s := stopRequestToPB(&sdk.StopRequest{InstanceID: "a/0"}); s.Launch != nil || s.LmcacheServer != nil {
		t.Fatalf("nil launches sent as %v", s)
	}
	if s := stopRequestFromPB(&pb.StopRequest{Launch: &pb.Launch{}}); s.Launch == nil {
		t.Fatal("a present empty launch read as absent")
	}
}

// fillGo sets every field reachable from v to a value of its own (n counts
// up, so no two fields share one and a swapped field shows).
func fillGo(v reflect.Value, n *int) {
	*n++
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			fillGo(v.Field(i), n)
		}
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fillGo(v.Elem(), n)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		for i := range 2 {
			fillGo(v.Index(i), n)
		}
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		for range 2 {
			k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
			fillGo(k, n)
			fillGo(e, n)
			v.SetMapIndex(k, e)
		}
	case reflect.String:
		v.SetString("s" + string(rune('A'+*n%26)) + string(rune('a'+*n/26%26)))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int32, reflect.Int64:
		if v.Type() == reflect.TypeFor[time.Duration]() {
			v.SetInt(int64(*n) * int64(time.Millisecond)) // the wire carries milliseconds
			return
		}
		v.SetInt(int64(*n))
	case reflect.Uint8, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(*n))
	case reflect.Float64:
		v.SetFloat(float64(*n) + 0.5)
	default:
		panic("fillGo: no value for " + v.Type().String())
	}
}

// fillPB sets every field of m, nested messages, lists and maps included.
func fillPB(m protoreflect.Message, n *int) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		switch {
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			for range 2 {
				mp.Set(pbScalar(fd.MapKey(), n).MapKey(), pbScalar(fd.MapValue(), n))
			}
		case fd.IsList():
			l := m.Mutable(fd).List()
			for range 2 {
				if fd.Message() != nil {
					e := l.NewElement()
					fillPB(e.Message(), n)
					l.Append(e)
				} else {
					l.Append(pbScalar(fd, n))
				}
			}
		case fd.Message() != nil:
			fillPB(m.Mutable(fd).Message(), n)
		default:
			m.Set(fd, pbScalar(fd, n))
		}
	}
}

func pbScalar(fd protoreflect.FieldDescriptor, n *int) protoreflect.Value {
	*n++
	switch fd.Kind() {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString("p" + string(rune('A'+*n%26)) + string(rune('a'+*n/26%26)))
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.Int32Kind:
		return protoreflect.ValueOfInt32(int32(*n))
	case protoreflect.Int64Kind:
		return protoreflect.ValueOfInt64(int64(*n))
	case protoreflect.Uint32Kind:
		return protoreflect.ValueOfUint32(uint32(*n))
	case protoreflect.Uint64Kind:
		return protoreflect.ValueOfUint64(uint64(*n))
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(float64(*n) + 0.5)
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte{byte(*n)})
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(protoreflect.EnumNumber(*n))
	}
	panic("pbScalar: no value for " + fd.FullName())
}

// goDiff names the first field where a and b differ.
func goDiff(a, b reflect.Value, path string) string {
	if a.Kind() == reflect.Pointer {
		if a.IsNil() || b.IsNil() {
			return fmt.Sprintf("%s: %v, then %v", path, a, b)
		}
		return goDiff(a.Elem(), b.Elem(), path)
	}
	if a.Kind() == reflect.Struct {
		for i := range a.NumField() {
			if !reflect.DeepEqual(a.Field(i).Interface(), b.Field(i).Interface()) {
				return goDiff(a.Field(i), b.Field(i), path+"."+a.Type().Field(i).Name)
			}
		}
	}
	return fmt.Sprintf("%s: %v, then %v", path, a, b)
}

// pbDiff names the first field where a and b differ.
func pbDiff(a, b protoreflect.Message, path string) string {
	fields := a.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		va, vb := a.Get(fd), b.Get(fd)
		if fd.Message() != nil && !fd.IsList() && !fd.IsMap() {
			if a.Has(fd) != b.Has(fd) {
				return fmt.Sprintf("%s.%s: present %v, then %v", path, fd.Name(), a.Has(fd), b.Has(fd))
			}
			if a.Has(fd) && !proto.Equal(va.Message().Interface(), vb.Message().Interface()) {
				return pbDiff(va.Message(), vb.Message(), path+"."+string(fd.Name()))
			}
			continue
		}
		if !va.Equal(vb) {
			return fmt.Sprintf("%s.%s: %v, then %v", path, fd.Name(), va, vb)
		}
	}
	return path + ": (unknown fields)"
}
