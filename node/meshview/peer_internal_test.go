package meshview

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/gossip"
)

// recordNotRouted are the fields of a member and its record that PeerOf does not map into
// route.Peer, each with what reads it instead. A field of gossip.Member or gossip.State that is
// neither mapped nor listed here fails TestPeerOfMapsEveryField: a new signal is routed by
// mapping it in PeerOf, or said here not to be.
var recordNotRouted = map[string]string{
	"Member.Addr":                  "the gossip address: membership only",
	"Member.Liveness":              "Mesh.AddPeers takes candidates (Member.Candidate) and stale members only",
	"Member.Updated":               "route.Policy.Observe, the record's time (Mesh.AddPeers)",
	"Member.Candidate":             "Mesh.AddPeers's choice of members",
	"Member.PrefixBlocks":          "the whole index's count: Mesh.AddPeers sets route.Peer.PrefixBlocks from the request's own match",
	"Member.Incarnation":           "GET /v1/mesh/peers",
	"State.Name":                   "Member.Name, which gossip takes from it",
	"State.HTTPAddr":               "GET /v1/mesh/peers and the dashboard",
	"State.QUICAddr":               "Mesh.AddPeers: where to forward (View.QUIC)",
	"State.Models[].ContextTokens": "admission's context check (Mesh.Served)",
	"State.Models[].BytesPerToken": "the token estimate of a request for the model (kvindex calibration)",
	"State.Adapters[].Parent":      "admission's context check (Mesh.Served) and GET /v1/models (Mesh.Models)",
	"State.BlockTokens":            "the node's own block size; the mesh shares one (kvindex)",
	"State.KeyUsage":               "admission's key rates across the mesh",
	"State.Claims":                 "gossip.ClaimedAhead: KV room counted as used in Mesh.AddPeers",
	"State.GPUName":                "GET /v1/mesh/peers",
	"State.CarbonZone":             "GET /v1/mesh/peers",
	"State.CarbonAgeSeconds":       "GET /v1/mesh/peers",
	"State.CarbonStale":            "carbonDirty: the view's dirty mark (plan.View.Add)",
	"State.SoftwareVersion":        "GET /v1/mesh/peers",
	"State.BootID":                 "gossip: a restart told apart from a late record",
	"State.Seq":                    "gossip: record order",
	"State.GossipAddr":             "gossip: a record from another address than the member's is a name conflict",
	"State.MessagesNative":         "forwardBody: a Messages request passes through to the owner (gossip.MessagesNative)",
}

// peerNotFromRecord are the fields of route.Peer that no field of the record sets, each with
// what does.
var peerNotFromRecord = map[string]string{
	"Ejected":      "the node's ejector (View.AddMember)",
	"PrefixBlocks": "the request's own prefix match (Mesh.AddPeers, Mesh.SelfPrefix)",
	"AdaptersCut":  "the length of State.Adapters, at gossip.MaxAdapters (PeerOf)",
	"AdapterLoad":  "the adapter source's load estimate (withSourceAdapter, ownerDecision)",
}

// baseMember is a member whose every field changes what PeerOf returns when it changes: an
// embedded engine (EngineKind decides WholeOnly), VRAM to spare, one model.
func baseMember() gossip.Member {
	return gossip.Member{Name: "n", State: gossip.State{EngineKind: "sim", VRAMTotalBytes: 80 << 30,
		Models: []gossip.ModelInfo{{Name: "m"}}, Adapters: []gossip.Adapter{{Name: "a", Parent: "m"}}}}
}

// TestPeerOfMapsEveryField pins PeerOf as the one mapping from a member's record to what
// routing reads: changing any field of gossip.Member or gossip.State (recursively, into a
// slice's element) changes the route.Peer it returns, unless recordNotRouted names the field;
// a named field changes nothing; and every field of route.Peer is set from the record or
// named in peerNotFromRecord.
func TestPeerOfMapsEveryField(t *testing.T) {
	base := baseMember()
	want := PeerOf(&base)
	set := map[string]bool{} // route.Peer fields some record field sets
	seen := map[string]bool{}
	var walk func(path string, v reflect.Value)
	walk = func(path string, v reflect.Value) {
		for i := range v.NumField() {
			f := v.Type().Field(i)
			fp := path + "." + f.Name
			fv := v.Field(i)
			if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeFor[time.Time]() {
				walk(f.Name, fv) // Member.State's fields are State.X
				continue
			}
			if f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Struct {
				if _, ignored := recordNotRouted[fp]; ignored {
					seen[fp] = true
					check(t, fp, &base, fv, want, set)
					continue
				}
				if fv.Len() == 0 {
					t.Fatalf("%s: baseMember has no element to change", fp)
				}
				walk(fp+"[]", fv.Index(0))
				continue
			}
			seen[fp] = true
			check(t, fp, &base, fv, want, set)
		}
	}
	walk("Member", reflect.ValueOf(&base).Elem())
	for p := range recordNotRouted {
		if !seen[p] {
			t.Errorf("recordNotRouted names %s, which the record does not have", p)
		}
	}
	pt := reflect.TypeFor[route.Peer]()
	for i := range pt.NumField() {
		f := pt.Field(i)
		_, other := peerNotFromRecord[f.Name]
		switch {
		case !set[f.Name] && !other:
			t.Errorf("route.Peer.%s is set from no field of the record: map it in PeerOf, or say in peerNotFromRecord what sets it", f.Name)
		case set[f.Name] && other:
			t.Errorf("route.Peer.%s is set from the record but listed in peerNotFromRecord", f.Name)
		}
	}
}

// check changes the field v of base (a path into it), calls PeerOf, and records which fields
// of the route.Peer differ from want; the field is restored after.
func check(t *testing.T, path string, base *gossip.Member, v reflect.Value, want route.Peer, set map[string]bool) {
	t.Helper()
	old := reflect.New(v.Type()).Elem()
	old.Set(v)
	defer v.Set(old)
	if err := change(v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	got := PeerOf(base)
	var changed []string
	gv, wv := reflect.ValueOf(got), reflect.ValueOf(want)
	for i := range gv.NumField() {
		if !reflect.DeepEqual(gv.Field(i).Interface(), wv.Field(i).Interface()) {
			changed = append(changed, gv.Type().Field(i).Name)
			set[gv.Type().Field(i).Name] = true
		}
	}
	why, ignored := recordNotRouted[path]
	switch {
	case len(changed) == 0 && !ignored:
		t.Errorf("%s is not routed: map it in PeerOf, or say in recordNotRouted what reads it instead", path)
	case len(changed) > 0 && ignored:
		t.Errorf("%s sets route.Peer %v but recordNotRouted says %q", path, changed, why)
	}
}

// change sets v to a value other than its own.
func change(v reflect.Value) error {
	switch v.Kind() {
	case reflect.String:
		v.SetString(v.String() + "x")
	case reflect.Bool:
		v.SetBool(!v.Bool())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(v.Int() + 1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(v.Uint() + 1)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(v.Float() + 1)
	case reflect.Slice:
		v.Set(reflect.Append(v, reflect.New(v.Type().Elem()).Elem()))
	case reflect.Struct:
		if t, ok := v.Interface().(time.Time); ok {
			v.Set(reflect.ValueOf(t.Add(time.Second)))
			return nil
		}
		return fmt.Errorf("struct %v: walk it", v.Type())
	default:
		return fmt.Errorf("no change for kind %v", v.Kind())
	}
	return nil
}
