package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kvmesh/kvmesh/node"
)

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "print a node's view of the mesh as a table",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "node", Value: "http://127.0.0.1:18080", Usage: "base URL of the node to ask", EnvVars: env("status-node")},
			&cli.BoolFlag{Name: "json", Usage: "print the raw JSON", EnvVars: env("status-json")},
			&cli.StringFlag{Name: "api-key", Usage: "API key sent as a bearer token, for a node with --api-keys (any key in its file)", EnvVars: env("status-api-key")},
			caCertFlag("status"),
		},
		Action: func(c *cli.Context) error {
			tlsCfg, err := clientTLS(c.String("ca-cert"))
			if err != nil {
				return fmt.Errorf("status: %w", err)
			}
			tr := http.DefaultTransport.(*http.Transport).Clone()
			tr.TLSClientConfig = tlsCfg
			client := &http.Client{Timeout: 10 * time.Second, Transport: tr}
			req, err := http.NewRequestWithContext(c.Context, http.MethodGet, strings.TrimRight(c.String("node"), "/")+"/v1/mesh/peers", nil)
			if err != nil {
				return err
			}
			if k := c.String("api-key"); k != "" {
				req.Header.Set("Authorization", "Bearer "+k)
			}
			resp, err := client.Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
			if err != nil {
				return err
			}
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("status: %s: %s", resp.Status, body)
			}
			if c.Bool("json") {
				_, err = os.Stdout.Write(body)
				return err
			}
			var pr node.PeersResponse
			if err := json.Unmarshal(body, &pr); err != nil {
				return fmt.Errorf("status: decoding the answer: %w", err)
			}
			return writeStatus(os.Stdout, pr)
		},
	}
}

// caCertFlag is the --ca-cert flag of a command (load, status) that talks to a node's API.
func caCertFlag(cmd string) cli.Flag {
	return &cli.StringFlag{Name: "ca-cert", Usage: "PEM CA certificate to verify an https node with (default: the system roots)", EnvVars: env(cmd + "-ca-cert")}
}

// clientTLS trusts the CA certificates in the PEM file caFile for https targets; with no file,
// nil: the system roots.
func clientTLS(caFile string) (*tls.Config, error) {
	if caFile == "" {
		return nil, nil
	}
	data, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("--ca-cert: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("--ca-cert: no certificate in %s", caFile)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// writeStatus prints one row per node, for a person to read at a glance.
func writeStatus(w io.Writer, pr node.PeersResponse) error {
	fmt.Fprintf(w, "view of %s\n", pr.Node)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tLIVENESS\tMODEL\tKV USE\tHIT RATE\tRUNNING\tWAITING\tQUEUED PREFILL\tPOWER\tTEMP\tCARBON\tAGE")
	for _, p := range pr.Peers {
		name := p.Name
		if p.Self {
			name += " *"
		}
		var models []string
		for _, m := range p.Models {
			models = append(models, m.Name)
		}
		power := "-"
		if p.PowerCapWatts > 0 {
			power = fmt.Sprintf("%.0f/%.0fW", p.PowerWatts, p.PowerCapWatts)
		}
		temp := "-"
		if p.TempC > 0 {
			temp = fmt.Sprintf("%.0f°C", p.TempC)
		}
		carbon := "-"
		if p.CarbonZone != "" || p.CarbonIntensity > 0 {
			carbon = fmt.Sprintf("%.0f %s", p.CarbonIntensity, p.CarbonZone)
			if p.CarbonStale {
				carbon += " (stale)"
			}
		}
		live := p.Liveness
		if p.Stale && live == "alive" {
			live = "alive (stale)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.0f%%\t%.0f%%\t%d\t%d\t%d\t%s\t%s\t%s\t%.1fs\n", name, live, strings.Join(models, ","),
			100*p.KVUse, 100*p.HitRate, p.Running, p.Waiting, p.QueuedPrefillTokens, power, temp, carbon, p.AgeSeconds)
	}
	return tw.Flush()
}
