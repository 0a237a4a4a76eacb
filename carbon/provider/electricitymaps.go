package provider

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/carbon"
)

// DefaultElectricityMapsURL is the public API's base.
const DefaultElectricityMapsURL = "https://api.electricitymap.org"

// ElectricityMaps reads GET {BaseURL}/v3/carbon-intensity/latest?zone=ZONE with header
// auth-token. Its values are hourly, so NextChange is the end of the reading's hour.
type ElectricityMaps struct {
	BaseURL    string // DefaultElectricityMapsURL when empty
	Zone       string // e.g. "DE", "US-CAL-CISO"
	Token      string // from TokenFromEnvOrFile, never from a flag
	HTTPClient *http.Client
}

var _ carbon.Provider = (*ElectricityMaps)(nil)

// Fetch asks for the latest reading of the zone.
func (e *ElectricityMaps) Fetch(ctx context.Context, now time.Time) (carbon.Reading, error) {
	if e.Zone == "" || e.Token == "" {
		return carbon.Reading{}, fmt.Errorf("%w: electricitymaps: zone and token are required", carbon.ErrConfig)
	}
	base := e.BaseURL
	if base == "" {
		base = DefaultElectricityMapsURL
	}
	u := strings.TrimRight(base, "/") + "/v3/carbon-intensity/latest?zone=" + url.QueryEscape(e.Zone)
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		return carbon.Reading{}, fmt.Errorf("%w: electricitymaps: %w", carbon.ErrConfig, err)
	}
	req.Header.Set("auth-token", e.Token)
	req.Header.Set("Accept", "application/json")
	body, err := get(ctx, e.HTTPClient, req, "electricitymaps", now)
	if err != nil {
		return carbon.Reading{}, err
	}
	r, err := parseElectricityMaps(body)
	if err != nil {
		return carbon.Reading{}, err
	}
	r.Fetched = now
	if r.Zone == "" {
		r.Zone = e.Zone
	}
	return r, nil
}

type emLatest struct {
	Zone            string     `json:"zone"`
	CarbonIntensity *float64   `json:"carbonIntensity"`
	Datetime        *time.Time `json:"datetime"`
	UpdatedAt       *time.Time `json:"updatedAt"`
	IsEstimated     bool       `json:"isEstimated"`
}

// parseElectricityMaps decodes a latest-intensity body. Fetched is left for the caller.
func parseElectricityMaps(body []byte) (carbon.Reading, error) {
	var v emLatest
	if err := json.Unmarshal(body, &v); err != nil {
		return carbon.Reading{}, fmt.Errorf("%w: electricitymaps: %w", carbon.ErrMalformed, err)
	}
	if v.CarbonIntensity == nil {
		return carbon.Reading{}, fmt.Errorf("%w: electricitymaps: no carbonIntensity", carbon.ErrMalformed)
	}
	ci := *v.CarbonIntensity
	if ci < 0 || math.IsNaN(ci) || math.IsInf(ci, 0) {
		return carbon.Reading{}, fmt.Errorf("%w: electricitymaps: carbonIntensity %v out of range", carbon.ErrMalformed, ci)
	}
	var at time.Time
	switch {
	case v.Datetime != nil && !v.Datetime.IsZero():
		at = *v.Datetime
	case v.UpdatedAt != nil && !v.UpdatedAt.IsZero():
		at = *v.UpdatedAt
	default:
		return carbon.Reading{}, fmt.Errorf("%w: electricitymaps: no datetime", carbon.ErrMalformed)
	}
	return carbon.Reading{
		Intensity:  ci,
		Unit:       carbon.UnitGramsPerKWh,
		Zone:       v.Zone,
		At:         at,
		NextChange: at.Truncate(time.Hour).Add(time.Hour),
		Estimated:  v.IsEstimated,
	}, nil
}
