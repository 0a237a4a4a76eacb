package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kvmesh/kvmesh/node"
)

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "print a node's view of the mesh as a table, with every live node's readiness",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "node", Value: "http://127.0.0.1:18080", Usage: "base URL of the node to ask (host:port alone means http)", EnvVars: env("status-node")},
			&cli.BoolFlag{Name: "json", Usage: "print the raw JSON", EnvVars: env("status-json")},
			&cli.StringFlag{Name: "api-key", Usage: "API key sent as a bearer token, for a node with --api-keys (any key in its file)", EnvVars: env("status-api-key")},
			caCertFlag("status"),
		},
		Action: func(c *cli.Context) error {
			base := baseURL(c.String("node"))
			tlsCfg, err := clientTLS(c.String("ca-cert"))
			if err != nil {
				return fmt.Errorf("status: %w", err)
			}
			tr := http.DefaultTransport.(*http.Transport).Clone()
			tr.TLSClientConfig = tlsCfg
			client := &http.Client{Timeout: 10 * time.Second, Transport: tr}
			status, body, err := get(c.Context, client, base+"/v1/mesh/peers", c.String("api-key"))
			if err != nil {
				return fmt.Errorf("status: %w", err)
			}
			if status != http.StatusOK {
				return fmt.Errorf("status: %d: %s", status, body)
			}
			if c.Bool("json") {
				_, err = c.App.Writer.Write(body)
				return err
			}
			var pr node.PeersResponse
			if err := json.Unmarshal(body, &pr); err != nil {
				return fmt.Errorf("status: decoding the answer: %w", err)
			}
			return writeStatus(c.App.Writer, pr, readiness(c.Context, pr, base, tr))
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

// baseURL makes --node a base URL: a host:port without a scheme is reached over http.
func baseURL(s string) string {
	s = strings.TrimRight(s, "/")
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	return s
}

// get fetches url, with key as a bearer token when set, and returns its status and (bounded)
// body.
func get(ctx context.Context, client *http.Client, url, key string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	return resp.StatusCode, body, err
}

// readiness asks every live node's /readyz, the node asked at base and its peers at their
// advertised HTTP addresses, and returns what each said by name: "ready", or the status and
// reason of a 503. A node that does not answer is left out. Peers are asked with base's scheme
// over tr (the same CA).
func readiness(ctx context.Context, pr node.PeersResponse, base string, tr http.RoundTripper) map[string]string {
	client := &http.Client{Timeout: 2 * time.Second, Transport: tr}
	scheme, _, _ := strings.Cut(base, "://")
	out := map[string]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, p := range pr.Peers {
		url := base
		if !p.Self {
			if p.Liveness != "alive" || p.HTTPAddr == "" {
				continue
			}
			url = scheme + "://" + p.HTTPAddr
		}
		wg.Go(func() {
			status, body, err := get(ctx, client, url+"/readyz", "")
			if err != nil {
				return
			}
			var rz struct{ Status, Reason string }
			_ = json.Unmarshal(body, &rz)
			said := "ready"
			if status != http.StatusOK {
				said = strings.TrimSuffix(rz.Status+": "+rz.Reason, ": ")
			}
			mu.Lock()
			out[p.Name] = said
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// writeStatus prints one row per node, for a person to read at a glance; ready is readiness's
// answer.
func writeStatus(w io.Writer, pr node.PeersResponse, ready map[string]string) error {
	fmt.Fprintf(w, "view of %s\n", pr.Node)
	if pr.JoinFailing != "" {
		fmt.Fprintf(w, "WARNING: %s\n", pr.JoinFailing)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tLIVENESS\tMODEL\tKV USE\tHIT RATE\tRUNNING\tWAITING\tQUEUED PREFILL\tPOWER\tTEMP\tCARBON\tAGE\tREADY")
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.0f%%\t%.0f%%\t%d\t%d\t%d\t%s\t%s\t%s\t%.1fs\t%s\n", name, live, strings.Join(models, ","),
			100*p.KVUse, 100*p.HitRate, p.Running, p.Waiting, p.QueuedPrefillTokens, power, temp, carbon, p.AgeSeconds, readyOf(p, ready))
	}
	return tw.Flush()
}

// readyOf is a node's readiness: what its /readyz said, else its gossiped engine health.
func readyOf(p node.PeerInfo, ready map[string]string) string {
	switch said, ok := ready[p.Name]; {
	case ok:
		return said
	case p.Liveness != "alive":
		return "-"
	case p.EngineHealthy:
		return "ready (gossip)"
	}
	return "not ready (gossip)"
}
