package main

import (
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/urfave/cli/v2"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/carbon"
	"github.com/kvmesh/kvmesh/carbon/provider"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/transport"
)

func carbonFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "carbon-provider", Usage: "grid carbon intensity: static, electricitymaps or watttime (empty: off)", EnvVars: env("carbon-provider")},
		&cli.StringFlag{Name: "carbon-zone", Usage: "Electricity Maps zone or WattTime region", EnvVars: env("carbon-zone")},
		&cli.Float64Flag{Name: "carbon-static-intensity", Usage: "static provider: the fixed intensity (gCO2eq/kWh)", EnvVars: env("carbon-static-intensity")},
		&cli.StringFlag{Name: "carbon-schedule", Usage: "static provider: intensity by hour, e.g. 0-6:120,7-18:450,19-23:200", EnvVars: env("carbon-schedule")},
		&cli.Float64Flag{Name: "carbon-threshold", Value: carbon.DefaultConfig().Threshold, Usage: "above this, sheddable requests do not run on this node", EnvVars: env("carbon-threshold")},
		&cli.DurationFlag{Name: "carbon-poll", Value: carbon.DefaultConfig().PollInterval, Usage: "provider poll interval", EnvVars: env("carbon-poll")},
		&cli.DurationFlag{Name: "carbon-max-age", Value: carbon.DefaultConfig().MaxAge, Usage: "a reading older than this is stale", EnvVars: env("carbon-max-age")},
		&cli.StringFlag{Name: "carbon-fail", Value: "open", Usage: "with no fresh reading: open (shed nothing) or closed (treat the grid as dirty)", EnvVars: env("carbon-fail")},
		&cli.StringFlag{Name: "carbon-token-file", Usage: "file holding the provider token (else KVMESH_CARBON_TOKEN); WattTime: user:password", EnvVars: env("carbon-token-file")},
		&cli.StringFlag{Name: "carbon-url", Usage: "provider base URL (default: the provider's public API)", EnvVars: env("carbon-url")},
	}
}

// meshConfig maps gossip, transport, routing, admission, telemetry and carbon flags.
func meshConfig(c *cli.Context, cfg *node.Config) error {
	host, port, err := splitHostPort(c.String("gossip"), 7946)
	if err != nil {
		return fmt.Errorf("--gossip: %w", err)
	}
	cfg.Gossip.BindAddr, cfg.Gossip.BindPort = host, port
	if adv := c.String("advertise"); adv != "" {
		cfg.AdvertiseHost = adv
		cfg.Gossip.AdvertiseAddr = adv
	}
	cfg.Gossip.Join = c.StringSlice("join")
	if k := c.String("gossip-key"); k != "" {
		key, err := base64.StdEncoding.DecodeString(k)
		if err != nil {
			return fmt.Errorf("--gossip-key: not base64: %w", err)
		}
		cfg.Gossip.Key = key
	} else if !c.Bool("insecure-dev") {
		return fmt.Errorf("--gossip-key is required (or --insecure-dev for a development node)")
	}
	cfg.Gossip.Insecure = c.Bool("insecure-dev")
	if sp := c.String("stale-policy"); sp != "" {
		cfg.Gossip.StalePolicy = gossip.StalePolicy(sp)
	}
	cfg.QUICAddr = c.String("quic")
	switch dir := c.String("tls-dir"); {
	case dir != "":
		if cfg.TLS, err = transport.LoadTLS(dir, cfg.Name); err != nil {
			return err
		}
	case c.Bool("insecure-dev"):
		// A throwaway CA of this node alone: fine for one node, refused by every peer.
		d, err := os.MkdirTemp("", "kvmesh-dev-ca-")
		if err != nil {
			return err
		}
		if err := transport.NewDevCA(d, cfg.Name); err != nil {
			return err
		}
		if cfg.TLS, err = transport.LoadTLS(d, cfg.Name); err != nil {
			return err
		}
	default:
		return fmt.Errorf("--tls-dir is required (kvmesh ca init/issue), or --insecure-dev for a development node")
	}
	cfg.Policy = c.String("policy")
	if f := c.String("config"); f != "" {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		if cfg.Admit, err = admit.LoadConfig(data); err != nil {
			return fmt.Errorf("--config %s: %w", f, err)
		}
	}
	cfg.APIKeysFile = c.String("api-keys")
	cfg.AgentFromUser = c.Bool("agent-from-user")
	cfg.GPU = c.String("gpu")
	return carbonConfig(c, cfg)
}

func carbonConfig(c *cli.Context, cfg *node.Config) error {
	kind := c.String("carbon-provider")
	if kind == "" {
		return nil
	}
	cc := &node.CarbonConfig{Tracker: carbon.DefaultConfig()}
	cc.Provider = provider.Config{
		Kind: kind, Zone: c.String("carbon-zone"), StaticIntensity: c.Float64("carbon-static-intensity"),
		StaticSchedule: c.String("carbon-schedule"), BaseURL: c.String("carbon-url"),
	}
	if kind != provider.KindStatic {
		tok, err := provider.TokenFromEnvOrFile("KVMESH_CARBON_TOKEN", c.String("carbon-token-file"))
		if err != nil {
			return fmt.Errorf("carbon token: %w", err)
		}
		if kind == provider.KindWattTime {
			user, pass, ok := cutColon(tok)
			if !ok {
				return fmt.Errorf("carbon token: WattTime wants user:password")
			}
			cc.Provider.Username, cc.Provider.Password = user, pass
		} else {
			cc.Provider.Token = tok
		}
	}
	cc.Tracker.Threshold = c.Float64("carbon-threshold")
	cc.Tracker.PollInterval = c.Duration("carbon-poll")
	cc.Tracker.MaxAge = c.Duration("carbon-max-age")
	mode, err := carbon.ParseFailMode(c.String("carbon-fail"))
	if err != nil {
		return fmt.Errorf("--carbon-fail: %w", err)
	}
	cc.Tracker.FailMode = mode
	cfg.Carbon = cc
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
	if p == "" {
		return host, defPort, nil
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return "", 0, err
	}
	if host == "" {
		host = "0.0.0.0"
	}
	return host, port, nil
}
