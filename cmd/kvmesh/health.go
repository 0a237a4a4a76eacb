package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kvmesh/kvmesh/node"
)

// healthCommand asks a node's /healthz (or /readyz) and exits non-zero unless it answers 200.
// It is the container image's HEALTHCHECK, which has no curl; it reads KVMESH_HTTP, as the
// node beside it does, so the two agree on the port.
func healthCommand() *cli.Command {
	return &cli.Command{
		Name:  "health",
		Usage: "exit 0 if the local node's /healthz (with --ready: /readyz) answers 200, else 1",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "http", Value: node.DefaultConfig().HTTPAddr, Usage: "the node's --http listen address; a wildcard host is asked on 127.0.0.1", EnvVars: env("http")},
			&cli.StringFlag{Name: "url", Usage: "full URL to ask instead (overrides --http and --ready)", EnvVars: env("health-url")},
			&cli.BoolFlag{Name: "ready", Usage: "ask /readyz: also fail while draining or while the engine is unhealthy", EnvVars: env("health-ready")},
			&cli.DurationFlag{Name: "timeout", Value: 3 * time.Second, Usage: "give up after this long", EnvVars: env("health-timeout")},
		},
		Action: func(c *cli.Context) error {
			url := c.String("url")
			if url == "" {
				path := "/healthz"
				if c.Bool("ready") {
					path = "/readyz"
				}
				var err error
				if url, err = healthURL(c.String("http"), path); err != nil {
					return err
				}
			}
			ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
			defer cancel()
			return checkHealth(ctx, url)
		},
	}
}

// healthURL turns a listen address (":8080", "0.0.0.0:8080", "10.0.0.5:8080", "[::]:8080")
// into the URL of path on it, asking a wildcard or empty host on loopback.
func healthURL(listen, path string) (string, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("health: --http %q: %w", listen, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
		if ip != nil && ip.To4() == nil {
			host = "::1"
		}
	}
	return "http://" + net.JoinHostPort(host, port) + path, nil
}

// checkHealth GETs url and returns nil on 200, an error naming the status and the first bytes
// of the body otherwise.
func checkHealth(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("health: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("health: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("health: %s: %s: %s", url, resp.Status, body)
	}
	return nil
}
