package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
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
			&cli.StringFlag{Name: "ca-cert", Usage: "PEM CA certificate trusted besides the system roots, for an https --url (a node with --tls-cert)", EnvVars: env("health-ca-cert")},
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
			client, err := healthClient(c.String("ca-cert"))
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
			defer cancel()
			return checkHealth(ctx, client, url)
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

// healthClient trusts caFile's certificates on top of the system roots, not instead of them
// as status and load do: a node's API certificate may come from a private CA or a public one,
// and a health check should pass against either.
func healthClient(caFile string) (*http.Client, error) {
	if caFile == "" {
		return http.DefaultClient, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("health: --ca-cert: %w", err)
	}
	roots, err := x509.SystemCertPool()
	if err != nil {
		roots = x509.NewCertPool() // no system roots to keep (e.g. a scratch image)
	}
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("health: --ca-cert: no certificate in %s", caFile)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	return &http.Client{Transport: tr}, nil
}

// checkHealth GETs url and returns nil on 200, an error naming the status and the first bytes
// of the body otherwise.
func checkHealth(ctx context.Context, client *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("health: %w", err)
	}
	resp, err := client.Do(req)
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
