package bench

import (
	"math"
	"strconv"
	"strings"
	"testing"
)

func TestResidencyErrorFromHistograms(t *testing.T) {
	node := func(zero, tenth, one int) string {
		return strings.Join([]string{
			"# TYPE kvmesh_residency_error_ratio histogram",
			`kvmesh_residency_error_ratio_bucket{le="0"} ` + itoa(zero),
			`kvmesh_residency_error_ratio_bucket{le="0.1"} ` + itoa(zero+tenth),
			`kvmesh_residency_error_ratio_bucket{le="1"} ` + itoa(zero+tenth+one),
			`kvmesh_residency_error_ratio_bucket{le="+Inf"} ` + itoa(zero+tenth+one),
			"kvmesh_residency_error_ratio_count " + itoa(zero+tenth+one),
			`kvmesh_other_bucket{le="0"} 99`,
			"kvmesh_residency_predicted_cached_tokens_total " + itoa(100*tenth),
			"kvmesh_residency_reported_cached_tokens_total " + itoa(90*tenth),
		}, "\n")
	}
	before, after := buckets{}, buckets{}
	for _, text := range []string{node(10, 0, 0), node(0, 0, 10)} {
		if err := parseBuckets(strings.NewReader(text), before); err != nil {
			t.Fatal(err)
		}
	}
	// Since then: 60 more right, 30 off by under a tenth, 10 wrong, over two nodes.
	for _, text := range []string{node(40, 20, 0), node(30, 10, 20)} {
		if err := parseBuckets(strings.NewReader(text), after); err != nil {
			t.Fatal(err)
		}
	}
	got := after.since(before).summary()
	if got.Judged != 100 {
		t.Fatalf("judged %d, want 100", got.Judged)
	}
	if got.Predicted != 3000 || got.Reported != 2700 {
		t.Errorf("cached tokens predicted %v, reported %v; want 3000 and 2700 (the 30 off by a tenth)", got.Predicted, got.Reported)
	}
	if got.P50 != 0 {
		t.Errorf("median %v, want 0 (60 of 100 exact)", got.P50)
	}
	// The 90th falls at the top of the (0, 0.1] bucket: 60 + 30 = 90.
	if math.Abs(got.P90-0.1) > 1e-9 {
		t.Errorf("p90 %v, want 0.1", got.P90)
	}
	if (buckets{}).summary() != (ResidencyError{}) {
		t.Error("an empty histogram must summarise to zero")
	}
	if err := parseBuckets(strings.NewReader(`kvmesh_residency_error_ratio_bucket{le="x"} 1`), buckets{}); err == nil {
		t.Error("a malformed bound must be an error")
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
