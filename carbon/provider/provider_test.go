package provider

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/carbon"
)

var t0 = time.Date(2026, 3, 4, 10, 20, 0, 0, time.UTC)

// serve starts a loopback server with h and closes it at the end of the test.
func serve(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// reply writes status and body, with an optional Retry-After.
func reply(w http.ResponseWriter, status int, retryAfter, body string) {
	if retryAfter != "" {
		w.Header().Set("Retry-After", retryAfter)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}

const emOK = `{"zone":"DE","carbonIntensity":302,"datetime":"2026-03-04T10:00:00.000Z",
"updatedAt":"2026-03-04T10:05:12.000Z","createdAt":"2026-03-01T10:00:00.000Z",
"emissionFactorType":"lifecycle","isEstimated":true,"estimationMethod":"TIME_SLICER_AVERAGE"}`

func TestElectricityMapsSuccess(t *testing.T) {
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v3/carbon-intensity/latest" || r.URL.Query().Get("zone") != "DE" {
			reply(w, 404, "", `{"error":"not found"}`)
			return
		}
		if r.Header.Get("auth-token") != "secret" {
			reply(w, 401, "", `{"error":"bad token"}`)
			return
		}
		reply(w, 200, "", emOK)
	})
	em := &ElectricityMaps{BaseURL: srv.URL, Zone: "DE", Token: "secret", HTTPClient: srv.Client()}
	got, err := em.Fetch(t.Context(), t0)
	if err != nil {
		t.Fatal(err)
	}
	want := carbon.Reading{
		Intensity: 302, Unit: carbon.UnitGramsPerKWh, Zone: "DE",
		At: time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC), Fetched: t0,
		NextChange: time.Date(2026, 3, 4, 11, 0, 0, 0, time.UTC), Estimated: true,
	}
	if !readingEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}

func readingEqual(a, b carbon.Reading) bool {
	return a.Intensity == b.Intensity && a.Unit == b.Unit && a.Zone == b.Zone && a.At.Equal(b.At) &&
		a.Fetched.Equal(b.Fetched) && a.NextChange.Equal(b.NextChange) && a.Estimated == b.Estimated
}

func TestProviderErrors(t *testing.T) {
	tests := []struct {
		name       string
		status     int
		retryAfter string
		body       string
		check      func(t *testing.T, err error)
	}{
		{"401", 401, "", `{"message":"unauthorized"}`, wantUnauthorized},
		{"403", 403, "", `{"message":"forbidden"}`, wantUnauthorized},
		{"500", 500, "", `oops`, func(t *testing.T, err error) {
			t.Helper()
			var he *carbon.HTTPError
			if !errors.As(err, &he) || he.StatusCode != 500 || errors.Is(err, carbon.ErrUnauthorized) {
				t.Fatalf("want carbon.HTTPError 500, got %v", err)
			}
		}},
		{"429 seconds", 429, "120", `{}`, wantRateLimited(120 * time.Second)},
		{"429 date", 429, t0.Add(90 * time.Second).Format(http.TimeFormat), `{}`, wantRateLimited(90 * time.Second)},
		{"429 none", 429, "", `{}`, wantRateLimited(0)},
		{"not json", 200, "", `<html>`, wantMalformed},
		{"empty", 200, "", ``, wantMalformed},
		{"no value", 200, "", `{"zone":"DE","datetime":"2026-03-04T10:00:00Z"}`, wantMalformed},
		{"null value", 200, "", `{"carbonIntensity":null,"datetime":"2026-03-04T10:00:00Z"}`, wantMalformed},
		{"string value", 200, "", `{"carbonIntensity":"302","datetime":"2026-03-04T10:00:00Z"}`, wantMalformed},
		{"negative", 200, "", `{"carbonIntensity":-1,"datetime":"2026-03-04T10:00:00Z"}`, wantMalformed},
		{"no time", 200, "", `{"carbonIntensity":302}`, wantMalformed},
		{"bad time", 200, "", `{"carbonIntensity":302,"datetime":"yesterday"}`, wantMalformed},
	}
	for _, tt := range tests {
		t.Run("electricitymaps/"+tt.name, func(t *testing.T) {
			srv := serve(t, func(w http.ResponseWriter, r *http.Request) { reply(w, tt.status, tt.retryAfter, tt.body) })
			em := &ElectricityMaps{BaseURL: srv.URL, Zone: "DE", Token: "x", HTTPClient: srv.Client()}
			r, err := em.Fetch(t.Context(), t0)
			if err == nil {
				t.Fatalf("want error, got reading %+v", r)
			}
			tt.check(t, err)
		})
	}
}

func wantUnauthorized(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, carbon.ErrUnauthorized) {
		t.Fatalf("want carbon.ErrUnauthorized, got %v", err)
	}
}

func wantMalformed(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, carbon.ErrMalformed) {
		t.Fatalf("want carbon.ErrMalformed, got %v", err)
	}
}

func wantRateLimited(d time.Duration) func(*testing.T, error) {
	return func(t *testing.T, err error) {
		t.Helper()
		var rl *carbon.RateLimitedError
		if !errors.As(err, &rl) {
			t.Fatalf("want carbon.RateLimitedError, got %v", err)
		}
		if rl.RetryAfter != d {
			t.Fatalf("RetryAfter = %s, want %s", rl.RetryAfter, d)
		}
	}
}

func TestRateLimitHonouredByTracker(t *testing.T) {
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) { reply(w, 429, "600", `{}`) })
	em := &ElectricityMaps{BaseURL: srv.URL, Zone: "DE", Token: "x", HTTPClient: srv.Client()}
	cfg := carbon.DefaultConfig()
	cfg.BackoffMin, cfg.BackoffMax = time.Second, time.Minute
	tr, err := carbon.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = em.Fetch(t.Context(), t0)
	tr.RecordError(t0, err)
	if got, want := tr.NextPoll(t0), t0.Add(600*time.Second); !got.Equal(want) {
		t.Fatalf("NextPoll = %s, want %s (Retry-After beyond BackoffMax)", got, want)
	}
}

func TestFetchTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	t.Cleanup(func() { close(release) }) // runs before srv.Close
	providers := map[string]carbon.Provider{
		"electricitymaps": &ElectricityMaps{BaseURL: srv.URL, Zone: "DE", Token: "x", HTTPClient: srv.Client()},
		"watttime":        &WattTime{BaseURL: srv.URL, Region: "R", Username: "u", Password: "p", HTTPClient: srv.Client()},
	}
	for name, p := range providers {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
			defer cancel()
			_, err := p.Fetch(ctx, t0)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("want context.DeadlineExceeded, got %v", err)
			}
		})
	}
}

// wattTimeServer fakes WattTime: /login hands out numbered tokens, and the index accepts only
// the latest one unless revoke is set.
type wattTimeServer struct {
	logins   atomic.Int32
	indexes  atomic.Int32
	revoke   atomic.Bool // the index answers 401 whatever the token
	loginErr atomic.Int32
	body     string
}

func (f *wattTimeServer) handler(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/login":
		if c := f.loginErr.Load(); c != 0 {
			reply(w, int(c), "", `{"error":"nope"}`)
			return
		}
		u, p, ok := r.BasicAuth()
		if !ok || u != "user" || p != "pw" {
			reply(w, 403, "", `{"error":"bad credentials"}`)
			return
		}
		n := f.logins.Add(1)
		reply(w, 200, "", `{"token":"tok`+string(rune('0'+n))+`"}`)
	case "/v3/signal-index":
		f.indexes.Add(1)
		q := r.URL.Query()
		want := "Bearer tok" + string(rune('0'+f.logins.Load()))
		if f.revoke.Load() || r.Header.Get("Authorization") != want {
			reply(w, 401, "", `{"error":"token expired"}`)
			return
		}
		if q.Get("region") != "CAISO_NORTH" || q.Get("signal_type") != "co2_moer" {
			reply(w, 400, "", `{"error":"bad query"}`)
			return
		}
		reply(w, 200, "", f.body)
	default:
		reply(w, 404, "", `{}`)
	}
}

const wtOK = `{"data":[{"point_time":"2026-03-04T10:15:00+00:00","value":73.0}],
"meta":{"data_point_period_seconds":300,"region":"CAISO_NORTH","signal_type":"co2_moer","units":"percentile",
"warnings":[],"model":{"date":"2026-02-01","type":"binned_regression"},"generated_at_period_seconds":300,
"generated_at":"2026-03-04T10:15:00+00:00"}}`

func newWattTime(t *testing.T, f *wattTimeServer) *WattTime {
	t.Helper()
	if f.body == "" {
		f.body = wtOK
	}
	srv := serve(t, f.handler)
	return &WattTime{BaseURL: srv.URL, Region: "CAISO_NORTH", Username: "user", Password: "pw", HTTPClient: srv.Client()}
}

func TestWattTimeSuccessAndTokenReuse(t *testing.T) {
	f := &wattTimeServer{}
	wt := newWattTime(t, f)
	for i, now := range []time.Time{t0, t0.Add(5 * time.Minute), t0.Add(20 * time.Minute)} {
		got, err := wt.Fetch(t.Context(), now)
		if err != nil {
			t.Fatalf("fetch %d: %v", i, err)
		}
		want := carbon.Reading{
			Intensity: 73, Unit: carbon.UnitPercentile, Zone: "CAISO_NORTH",
			At: time.Date(2026, 3, 4, 10, 15, 0, 0, time.UTC), Fetched: now,
			NextChange: time.Date(2026, 3, 4, 10, 20, 0, 0, time.UTC),
		}
		if !readingEqual(got, want) {
			t.Fatalf("fetch %d: got %+v\nwant %+v", i, got, want)
		}
	}
	if n := f.logins.Load(); n != 1 {
		t.Fatalf("logins = %d, want 1 (token reused within its 30 minutes)", n)
	}
}

func TestWattTimeRefreshBeforeExpiry(t *testing.T) {
	f := &wattTimeServer{}
	wt := newWattTime(t, f)
	if _, err := wt.Fetch(t.Context(), t0); err != nil {
		t.Fatal(err)
	}
	// 29 minutes in: inside the refresh margin, so a new login goes first.
	if _, err := wt.Fetch(t.Context(), t0.Add(29*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if n, idx := f.logins.Load(), f.indexes.Load(); n != 2 || idx != 2 {
		t.Fatalf("logins = %d, index calls = %d; want 2 and 2 (no request with a lapsing token)", n, idx)
	}
}

func TestWattTimeReloginOn401(t *testing.T) {
	f := &wattTimeServer{}
	wt := newWattTime(t, f)
	if _, err := wt.Fetch(t.Context(), t0); err != nil {
		t.Fatal(err)
	}
	// The server forgets tokens early (a restart): the next login's token is the only valid one.
	f.logins.Add(1)
	got, err := wt.Fetch(t.Context(), t0.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if got.Intensity != 73 {
		t.Fatalf("intensity = %v after re-login", got.Intensity)
	}
	if n := f.logins.Load(); n != 3 {
		t.Fatalf("logins counter = %d, want 3 (one re-login)", n)
	}
}

func TestWattTimeReloginOnlyOnce(t *testing.T) {
	f := &wattTimeServer{}
	f.revoke.Store(true)
	wt := newWattTime(t, f)
	_, err := wt.Fetch(t.Context(), t0)
	wantUnauthorized(t, err)
	if n, idx := f.logins.Load(), f.indexes.Load(); n != 2 || idx != 2 {
		t.Fatalf("logins = %d, index calls = %d; want 2 and 2", n, idx)
	}
}

func TestWattTimeLoginErrors(t *testing.T) {
	tests := []struct {
		name   string
		status int
		check  func(*testing.T, error)
	}{
		{"401", 401, wantUnauthorized},
		{"403", 403, wantUnauthorized},
		{"429", 429, wantRateLimited(0)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &wattTimeServer{}
			f.loginErr.Store(int32(tt.status))
			wt := newWattTime(t, f)
			_, err := wt.Fetch(t.Context(), t0)
			tt.check(t, err)
			if f.indexes.Load() != 0 {
				t.Fatal("index called without a token")
			}
		})
	}
	t.Run("wrong password", func(t *testing.T) {
		f := &wattTimeServer{}
		wt := newWattTime(t, f)
		wt.Password = "wrong"
		_, err := wt.Fetch(t.Context(), t0)
		wantUnauthorized(t, err)
	})
}

func TestWattTimeMalformed(t *testing.T) {
	bodies := map[string]string{
		"not json":     `{"data":`,
		"no data":      `{"data":[],"meta":{}}`,
		"null value":   `{"data":[{"point_time":"2026-03-04T10:15:00Z","value":null}]}`,
		"no time":      `{"data":[{"value":50}]}`,
		"over 100":     `{"data":[{"point_time":"2026-03-04T10:15:00Z","value":140}]}`,
		"negative":     `{"data":[{"point_time":"2026-03-04T10:15:00Z","value":-3}]}`,
		"value string": `{"data":[{"point_time":"2026-03-04T10:15:00Z","value":"50"}]}`,
	}
	for name, body := range bodies {
		t.Run(name, func(t *testing.T) {
			wt := newWattTime(t, &wattTimeServer{body: body})
			r, err := wt.Fetch(t.Context(), t0)
			if err == nil {
				t.Fatalf("want error, got %+v", r)
			}
			wantMalformed(t, err)
		})
	}
	t.Run("login without token", func(t *testing.T) {
		srv := serve(t, func(w http.ResponseWriter, r *http.Request) { reply(w, 200, "", `{"tok":"x"}`) })
		wt := &WattTime{BaseURL: srv.URL, Region: "R", Username: "u", Password: "p", HTTPClient: srv.Client()}
		_, err := wt.Fetch(t.Context(), t0)
		wantMalformed(t, err)
	})
}

func TestWattTimeNewestPointWins(t *testing.T) {
	body := `{"data":[{"point_time":"2026-03-04T10:10:00Z","value":10},
{"point_time":"2026-03-04T10:15:00Z","value":20},{"point_time":"2026-03-04T10:05:00Z","value":30}],"meta":{}}`
	r, err := parseWattTimeIndex([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if r.Intensity != 20 || !r.NextChange.Equal(time.Date(2026, 3, 4, 10, 20, 0, 0, time.UTC)) {
		t.Fatalf("got %+v, want value 20 and NextChange 10:20 (default 5 min period)", r)
	}
}

func TestNew(t *testing.T) {
	tests := []struct {
		cfg  Config
		want string // the built provider's type; empty: an error wrapping carbon.ErrConfig
	}{
		{Config{Kind: "static", StaticIntensity: 100}, "*carbon.Static"},
		{Config{Kind: "static", StaticSchedule: "0-23:5"}, "*carbon.Static"},
		{Config{Kind: "static", StaticSchedule: "0-22:5"}, ""},
		{Config{Kind: "static", StaticIntensity: -1}, ""},
		{Config{Kind: "electricitymaps", Zone: "DE", Token: "t"}, "*provider.ElectricityMaps"},
		{Config{Kind: "electricitymaps", Zone: "DE"}, ""},
		{Config{Kind: "watttime", Zone: "R", Username: "u", Password: "p"}, "*provider.WattTime"},
		{Config{Kind: "WattTime", Zone: "R", Username: "u", Password: "p"}, "*provider.WattTime"},
		{Config{Kind: "watttime", Zone: "R", Username: "u"}, ""},
		{Config{Kind: "carbonhub"}, ""},
	}
	for _, tt := range tests {
		p, err := New(tt.cfg)
		if tt.want == "" {
			if p != nil || !errors.Is(err, carbon.ErrConfig) {
				t.Errorf("New(%+v) = %v, %v; want an error wrapping carbon.ErrConfig", tt.cfg, p, err)
			}
			continue
		}
		if err != nil || fmt.Sprintf("%T", p) != tt.want {
			t.Errorf("New(%+v) = %T, %v; want %s", tt.cfg, p, err, tt.want)
		}
	}
}
