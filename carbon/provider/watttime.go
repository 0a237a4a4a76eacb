package provider

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/carbon"
)

// DefaultWattTimeURL is the public API's base.
const DefaultWattTimeURL = "https://api.watttime.org"

const (
	// wattTimeTokenTTL is how long WattTime says a login token lives.
	wattTimeTokenTTL = 30 * time.Minute
	// wattTimeRefreshMargin logs in again this long before the token would expire, so a
	// request never goes out with a token about to lapse.
	wattTimeRefreshMargin = 2 * time.Minute
	// wattTimeDefaultPeriod is the signal's step when meta omits data_point_period_seconds.
	wattTimeDefaultPeriod = 5 * time.Minute
)

// WattTime reads the co2_moer signal index of a region: GET {BaseURL}/login with HTTP basic
// auth gives a token (kept until shortly before its 30 minutes run out), then GET
// {BaseURL}/v3/signal-index?region=R&signal_type=co2_moer with a Bearer token. A 401 on the
// data call logs in again once and retries. The value is a 0–100 percentile (UnitPercentile),
// so a Tracker's threshold with this provider is a percentile.
type WattTime struct {
	BaseURL    string // DefaultWattTimeURL when empty
	Region     string // e.g. "CAISO_NORTH"
	Username   string
	Password   string // from TokenFromEnvOrFile, never from a flag
	HTTPClient *http.Client

	mu      sync.Mutex
	token   string
	expires time.Time
}

var _ carbon.Provider = (*WattTime)(nil)

// Fetch returns the latest signal index, logging in first when needed.
func (w *WattTime) Fetch(ctx context.Context, now time.Time) (carbon.Reading, error) {
	if w.Region == "" || w.Username == "" || w.Password == "" {
		return carbon.Reading{}, fmt.Errorf("%w: watttime: region, username and password are required", carbon.ErrConfig)
	}
	// One fetch at a time keeps the token logic simple; the node polls rarely.
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.token == "" || !now.Before(w.expires.Add(-wattTimeRefreshMargin)) {
		if err := w.loginLocked(ctx, now); err != nil {
			return carbon.Reading{}, err
		}
	}
	r, err := w.indexLocked(ctx, now)
	var he *carbon.HTTPError
	if errors.As(err, &he) && he.StatusCode == http.StatusUnauthorized {
		// The token was revoked or expired early: log in again, once.
		if err := w.loginLocked(ctx, now); err != nil {
			return carbon.Reading{}, err
		}
		r, err = w.indexLocked(ctx, now)
	}
	return r, err
}

func (w *WattTime) base() string {
	if w.BaseURL == "" {
		return DefaultWattTimeURL
	}
	return strings.TrimRight(w.BaseURL, "/")
}

func (w *WattTime) loginLocked(ctx context.Context, now time.Time) error {
	w.token = ""
	req, err := http.NewRequest(http.MethodGet, w.base()+"/login", nil)
	if err != nil {
		return fmt.Errorf("%w: watttime: %w", carbon.ErrConfig, err)
	}
	req.SetBasicAuth(w.Username, w.Password)
	body, err := get(ctx, w.HTTPClient, req, "watttime login", now)
	if err != nil {
		return err
	}
	var v struct {
		Token string `json:"token"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return fmt.Errorf("%w: watttime: login: %w", carbon.ErrMalformed, err)
	}
	if v.Token == "" {
		return fmt.Errorf("%w: watttime: login: no token", carbon.ErrMalformed)
	}
	w.token, w.expires = v.Token, now.Add(wattTimeTokenTTL)
	return nil
}

func (w *WattTime) indexLocked(ctx context.Context, now time.Time) (carbon.Reading, error) {
	q := url.Values{"region": {w.Region}, "signal_type": {"co2_moer"}}
	req, err := http.NewRequest(http.MethodGet, w.base()+"/v3/signal-index?"+q.Encode(), nil)
	if err != nil {
		return carbon.Reading{}, fmt.Errorf("%w: watttime: %w", carbon.ErrConfig, err)
	}
	req.Header.Set("Authorization", "Bearer "+w.token)
	body, err := get(ctx, w.HTTPClient, req, "watttime", now)
	if err != nil {
		return carbon.Reading{}, err
	}
	r, err := parseWattTimeIndex(body)
	if err != nil {
		return carbon.Reading{}, err
	}
	r.Fetched = now
	if r.Zone == "" {
		r.Zone = w.Region
	}
	return r, nil
}

type wtIndex struct {
	Data []struct {
		PointTime *time.Time `json:"point_time"`
		Value     *float64   `json:"value"`
	} `json:"data"`
	Meta struct {
		Region                 string  `json:"region"`
		DataPointPeriodSeconds float64 `json:"data_point_period_seconds"`
	} `json:"meta"`
}

// parseWattTimeIndex decodes a signal-index body; the newest point wins. Fetched is left for
// the caller.
func parseWattTimeIndex(body []byte) (carbon.Reading, error) {
	var v wtIndex
	if err := json.Unmarshal(body, &v); err != nil {
		return carbon.Reading{}, fmt.Errorf("%w: watttime: %w", carbon.ErrMalformed, err)
	}
	if len(v.Data) == 0 {
		return carbon.Reading{}, fmt.Errorf("%w: watttime: no data points", carbon.ErrMalformed)
	}
	best := -1
	for i, p := range v.Data {
		if p.PointTime == nil || p.PointTime.IsZero() || p.Value == nil {
			return carbon.Reading{}, fmt.Errorf("%w: watttime: data point %d lacks point_time or value", carbon.ErrMalformed, i)
		}
		val := *p.Value
		if val < 0 || val > 100 || math.IsNaN(val) {
			return carbon.Reading{}, fmt.Errorf("%w: watttime: value %v outside 0..100", carbon.ErrMalformed, val)
		}
		if best < 0 || p.PointTime.After(*v.Data[best].PointTime) {
			best = i
		}
	}
	period := wattTimeDefaultPeriod
	if s := v.Meta.DataPointPeriodSeconds; s > 0 && s <= 86400 {
		period = time.Duration(s * float64(time.Second))
	}
	at := *v.Data[best].PointTime
	return carbon.Reading{
		Intensity:  *v.Data[best].Value,
		Unit:       carbon.UnitPercentile,
		Zone:       v.Meta.Region,
		At:         at,
		NextChange: at.Add(period),
	}, nil
}
