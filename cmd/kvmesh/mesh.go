package main

import (
	"encoding/base64"
	"fmt"
	"net"
	"strconv"

	"github.com/urfave/cli/v2"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/carbon"
	"github.com/kvmesh/kvmesh/carbon/provider"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/nodeconfig"
)

func carbonFlags() []cli.Flag {
	d := nodeconfig.DefaultCarbonConfig()
	return []cli.Flag{
		&cli.StringFlag{Name: "carbon-provider", Usage: "grid carbon intensity: static, electricitymaps or watttime (empty: off)", EnvVars: env("carbon-provider")},
		&cli.StringFlag{Name: "carbon-zone", Usage: "Electricity Maps zone or WattTime region", EnvVars: env("carbon-zone")},
		&cli.Float64Flag{Name: "carbon-static-intensity", Usage: "static provider: the fixed intensity (gCO2eq/kWh)", EnvVars: env("carbon-static-intensity")},
		&cli.StringFlag{Name: "carbon-schedule", Usage: "static provider: intensity by hour, e.g. 0-6:120,7-18:450,19-23:200", EnvVars: env("carbon-schedule")},
		&cli.Float64Flag{Name: "carbon-threshold", Value: d.Tracker.Threshold, Usage: "above this, sheddable requests do not run on this node", EnvVars: env("carbon-threshold")},
		&cli.DurationFlag{Name: "carbon-poll", Value: d.Tracker.PollInterval, Usage: "provider poll interval", EnvVars: env("carbon-poll")},
		&cli.DurationFlag{Name: "carbon-max-age", Value: d.Tracker.MaxAge, Usage: "a reading older than this is stale", EnvVars: env("carbon-max-age")},
		&cli.StringFlag{Name: "carbon-fail", Value: d.Tracker.FailMode.String(), Usage: "with no fresh reading: open (shed nothing) or closed (treat the grid as dirty)", EnvVars: env("carbon-fail")},
		&cli.StringFlag{Name: "carbon-token-file", Usage: "file holding the provider token (else KVMESH_CARBON_TOKEN); WattTime: user:password", EnvVars: env("carbon-token-file")},
		&cli.StringFlag{Name: "carbon-url", Usage: "provider base URL (default: the provider's public API)", EnvVars: env("carbon-url")},
	}
}

// meshConfig maps the gossip, transport, routing, admission, telemetry and carbon flags that
// are set.
func meshConfig(c *cli.Context, cfg *node.Config) error {
	if c.IsSet("gossip") {
		host, port, err := splitHostPort(c.String("gossip"), node.DefaultConfig().Gossip.BindPort)
		if err != nil {
			return fmt.Errorf("--gossip: %w", err)
		}
		if port == 0 {
			port = gossip.AnyPort
		}
		cfg.Gossip.BindAddr, cfg.Gossip.BindPort = host, port
	}
	if c.IsSet("advertise") {
		if _, _, err := net.SplitHostPort(c.String("advertise")); err == nil {
			// One host for three ports (gossip, HTTP, QUIC): each is advertised with its own.
			return fmt.Errorf("--advertise %q: give a host (an IP or a name) without a port; each port is advertised as bound", c.String("advertise"))
		}
		cfg.AdvertiseHost = c.String("advertise")
		cfg.Gossip.AdvertiseAddr = cfg.AdvertiseHost
	}
	setStrings(c, "join", &cfg.Gossip.Join)
	if c.IsSet("gossip-key") {
		key, err := base64.StdEncoding.DecodeString(c.String("gossip-key"))
		if err != nil {
			return fmt.Errorf("--gossip-key: not base64: %w", err)
		}
		cfg.Gossip.Key = key
	}
	setBool(c, "insecure-dev", &cfg.Gossip.Insecure)
	if c.IsSet("stale-policy") {
		// One knob for both layers: gossip's candidate marking and the router's freshness
		// filter, or "open" would still drop stale peers at the router.
		sp := c.String("stale-policy")
		cfg.Gossip.StalePolicy = gossip.StalePolicy(sp)
		rp, err := route.ParseStalePolicy(sp)
		if err != nil {
			return fmt.Errorf("--stale-policy: %w", err)
		}
		cfg.Route.StalePolicy = rp
	}
	setString(c, "quic", &cfg.QUICAddr)
	setDuration(c, "handshake-timeout", &cfg.HandshakeTimeout)
	setString(c, "tls-dir", &cfg.TLSDir)
	setString(c, "dev-ca-dir", &cfg.DevCADir)
	setString(c, "tls-cert", &cfg.TLSCert)
	setString(c, "tls-key", &cfg.TLSKey)
	setString(c, "policy", &cfg.Policy)
	setString(c, "api-keys", &cfg.APIKeysFile)
	if c.IsSet("max-priority") {
		p, err := admit.ParsePriority(c.String("max-priority"))
		if err != nil {
			return fmt.Errorf("--max-priority: %w", err)
		}
		cfg.Admit.Keys.MaxPriority = &p
	}
	setBool(c, "agent-from-user", &cfg.AgentFromUser)
	setString(c, "gpu", &cfg.GPU)
	return carbonConfig(c, cfg)
}

// carbonConfig maps the carbon flags that are set: --carbon-provider turns carbon on (over the
// file's carbon section, if any) or, empty, off; the others change a carbon config that is on.
func carbonConfig(c *cli.Context, cfg *node.Config) error {
	if c.IsSet("carbon-provider") {
		if kind := c.String("carbon-provider"); kind != "" {
			cc := nodeconfig.DefaultCarbonConfig()
			if cfg.Carbon != nil {
				cc = *cfg.Carbon
			}
			cc.Provider.Kind = kind
			cfg.Carbon = &cc
		} else {
			cfg.Carbon = nil
		}
	}
	if cfg.Carbon == nil {
		return nil
	}
	cc := *cfg.Carbon
	setString(c, "carbon-zone", &cc.Provider.Zone)
	setFloat(c, "carbon-static-intensity", &cc.Provider.StaticIntensity)
	setString(c, "carbon-schedule", &cc.Provider.StaticSchedule)
	setString(c, "carbon-url", &cc.Provider.BaseURL)
	setString(c, "carbon-token-file", &cc.TokenFile)
	setFloat(c, "carbon-threshold", &cc.Tracker.Threshold)
	setDuration(c, "carbon-poll", &cc.Tracker.PollInterval)
	setDuration(c, "carbon-max-age", &cc.Tracker.MaxAge)
	if c.IsSet("carbon-fail") {
		mode, err := carbon.ParseFailMode(c.String("carbon-fail"))
		if err != nil {
			return fmt.Errorf("--carbon-fail: %w", err)
		}
		cc.Tracker.FailMode = mode
	}
	cfg.Carbon = &cc
	return nil
}

// loadNodeFiles checks and reads what a running node needs beyond its settings: the gossip
// key, the TLS certificates (with --insecure-dev and no --tls-dir, a leaf of this process's
// own under the host's development CA), and the carbon provider's credentials.
func loadNodeFiles(cfg *node.Config) error {
	if len(cfg.Gossip.Key) == 0 && !cfg.Gossip.Insecure {
		return fmt.Errorf("--gossip-key is required (or --insecure-dev for a development node)")
	}
	tlsFrom := cfg.TLSDir
	switch {
	case cfg.TLSDir != "":
		if err := cfg.LoadTLS(); err != nil {
			return err
		}
	case cfg.Gossip.Insecure:
		dir, err := cfg.LoadDevTLS()
		if err != nil {
			return fmt.Errorf("--insecure-dev: %w (--dev-ca-dir picks another directory)", err)
		}
		tlsFrom = "development CA in " + dir
	default:
		return fmt.Errorf("--tls-dir is required (kvmesh ca init/issue), or --insecure-dev for a development node")
	}
	if cfg.Gossip.Insecure && cfg.Logger != nil {
		cfg.Logger.Warn("INSECURE development mode (--insecure-dev): this mesh is not secure, do not use it in production",
			"gossip_encrypted", len(cfg.Gossip.Key) > 0, "peer_tls", tlsFrom)
	}
	if cfg.Carbon == nil || cfg.Carbon.Provider.Kind == provider.KindStatic {
		return nil
	}
	cc := *cfg.Carbon
	tok, err := provider.TokenFromEnvOrFile("KVMESH_CARBON_TOKEN", cc.TokenFile)
	if err != nil {
		return fmt.Errorf("carbon token: %w", err)
	}
	if cc.Provider.Kind == provider.KindWattTime {
		user, pass, ok := cutColon(tok)
		if !ok {
			return fmt.Errorf("carbon token: WattTime wants user:password")
		}
		cc.Provider.Username, cc.Provider.Password = user, pass
	} else {
		cc.Provider.Token = tok
	}
	cfg.Carbon = &cc
	return nil
}

func cutColon(s string) (string, string, bool) {
	for i := range len(s) {
		if s[i] == ':' {
			return s[:i], s[i+1:], true
		}
	}
	return "", "", false
}

func splitHostPort(addr string, defPort int) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	if host == "" {
		host = "0.0.0.0"
	}
	if p == "" {
		return host, defPort, nil
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return "", 0, err
	}
	return host, port, nil
}
