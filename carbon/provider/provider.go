package provider

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/kvmesh/kvmesh/carbon"
)

// Kinds accepted by New (the --carbon-provider values).
const (
	KindStatic          = "static"
	KindElectricityMaps = "electricitymaps"
	KindWattTime        = "watttime"
)

// Config maps the node's carbon settings to a carbon.Provider. The JSON names are the config
// file's (section "carbon", "provider"); the credentials have none, so that no file, and no
// printed config, holds them: they come from the environment or a token file.
type Config struct {
	Kind string `json:"kind"` // KindStatic, KindElectricityMaps or KindWattTime (any case)
	Zone string `json:"zone"` // Electricity Maps zone or WattTime region; Static's reported zone

	StaticIntensity float64 `json:"static_intensity"` // static: the fixed value
	StaticSchedule  string  `json:"static_schedule"`  // static: carbon.ParseSchedule syntax; overrides StaticIntensity

	Token    string `json:"-"` // electricitymaps: auth-token
	Username string `json:"-"` // watttime
	Password string `json:"-"` // watttime

	BaseURL    string       `json:"base_url,advanced"` // empty: the provider's public API
	HTTPClient *http.Client `json:"-"`
}

// New validates cfg and builds its provider: a *carbon.Static, an *ElectricityMaps or a
// *WattTime. It does no I/O. Errors wrap carbon.ErrConfig.
func New(cfg Config) (carbon.Provider, error) {
	switch strings.ToLower(cfg.Kind) {
	case KindStatic:
		if cfg.StaticIntensity < 0 {
			return nil, fmt.Errorf("%w: static intensity must be ≥ 0", carbon.ErrConfig)
		}
		s := &carbon.Static{Intensity: cfg.StaticIntensity, Zone: cfg.Zone}
		if cfg.StaticSchedule != "" {
			sch, err := carbon.ParseSchedule(cfg.StaticSchedule)
			if err != nil {
				return nil, err
			}
			s.Schedule = &sch
		}
		return s, nil
	case KindElectricityMaps:
		if cfg.Zone == "" || cfg.Token == "" {
			return nil, fmt.Errorf("%w: electricitymaps needs a zone and a token", carbon.ErrConfig)
		}
		return &ElectricityMaps{BaseURL: cfg.BaseURL, Zone: cfg.Zone, Token: cfg.Token, HTTPClient: cfg.HTTPClient}, nil
	case KindWattTime:
		if cfg.Zone == "" || cfg.Username == "" || cfg.Password == "" {
			return nil, fmt.Errorf("%w: watttime needs a region, a username and a password", carbon.ErrConfig)
		}
		return &WattTime{BaseURL: cfg.BaseURL, Region: cfg.Zone, Username: cfg.Username, Password: cfg.Password, HTTPClient: cfg.HTTPClient}, nil
	}
	return nil, fmt.Errorf("%w: unknown provider %q: want static, electricitymaps or watttime", carbon.ErrConfig, cfg.Kind)
}
