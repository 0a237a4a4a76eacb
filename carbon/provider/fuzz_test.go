package provider

import (
	"errors"
	"math"
	"testing"

	"github.com/kvmesh/kvmesh/carbon"
)

// checkParsed pins the decoders' promise: an error, or a usable reading, never a zero one.
func checkParsed(t *testing.T, r carbon.Reading, err error, maxValue float64) {
	t.Helper()
	if err != nil {
		if !errors.Is(err, carbon.ErrMalformed) {
			t.Fatalf("error %v does not wrap ErrMalformed", err)
		}
		return
	}
	if r.At.IsZero() || math.IsNaN(r.Intensity) || r.Intensity < 0 || r.Intensity > maxValue || r.Unit == "" {
		t.Fatalf("accepted unusable reading %+v", r)
	}
}

func FuzzParseElectricityMaps(f *testing.F) {
	f.Add([]byte(emOK))
	f.Add([]byte(`{"carbonIntensity":1e308,"updatedAt":"2026-03-04T10:00:00Z"}`))
	f.Add([]byte(`{"carbonIntensity":null}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := parseElectricityMaps(body)
		checkParsed(t, r, err, math.MaxFloat64)
	})
}

func FuzzParseWattTimeIndex(f *testing.F) {
	f.Add([]byte(wtOK))
	f.Add([]byte(`{"data":[{"point_time":"2026-03-04T10:15:00Z","value":100}],"meta":{"data_point_period_seconds":1e300}}`))
	f.Add([]byte(`{"data":[{}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := parseWattTimeIndex(body)
		checkParsed(t, r, err, 100)
	})
}
