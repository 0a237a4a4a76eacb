package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/testnet"
)

func testnetCommand() *cli.Command {
	return &cli.Command{
		Name:  "testnet",
		Usage: "run a local mesh of N nodes on loopback on the simulated engine, embedded or external (mTLS, gossip key), until Ctrl-C",
		Flags: append([]cli.Flag{
			&cli.IntFlag{Name: "nodes", Value: 3, Usage: "number of nodes", EnvVars: env("testnet-nodes")},
			&cli.BoolFlag{Name: "light", Usage: "light nodes, so that dozens share two cores: state records every 5 s, no GPU telemetry, a small KV pool",
				DefaultText: fmt.Sprintf("on above %d nodes", testnet.LightAbove), EnvVars: env("testnet-light")},
			&cli.IntFlag{Name: "http-base", Value: 18080, Usage: "node i serves HTTP on port http-base+i", EnvVars: env("testnet-http-base")},
			&cli.IntFlag{Name: "gossip-base", Usage: "node i gossips (UDP and TCP) on port gossip-base+i; 0 picks free ports", EnvVars: env("testnet-gossip-base")},
			&cli.StringFlag{Name: "engines", Value: testnet.EnginesEmbedded, Usage: "embedded (the simulated engine in each node) or external (each node in front of its own kvmesh engine over HTTP)", EnvVars: env("testnet-engines")},
			&cli.StringFlag{Name: "policy", Value: node.DefaultConfig().Policy, Usage: "routing policy of every node", EnvVars: env("testnet-policy")},
			&cli.StringSliceFlag{Name: "roles", Usage: "node i's role, comma-separated in node order (mixed, prefill or decode; nodes past the list are mixed), e.g. prefill,prefill,decode,decode: a disaggregated mesh", EnvVars: env("testnet-roles")},
			&cli.StringFlag{Name: "otlp-endpoint", Usage: "send every node's traces over OTLP/HTTP to this collector (host:port or a URL)", EnvVars: env("testnet-otlp-endpoint")},
		}, simFlags()...),
		Action: func(c *cli.Context) error {
			log, err := newLogger(c)
			if err != nil {
				return err
			}
			light := c.Int("nodes") > testnet.LightAbove
			if c.IsSet("light") {
				light = c.Bool("light")
			}
			tc := testnet.Config{
				Nodes:      c.Int("nodes"),
				Light:      light,
				HTTPBase:   c.Int("http-base"),
				GossipBase: c.Int("gossip-base"),
				Engines:    c.String("engines"),
				Roles:      c.StringSlice("roles"),
				Logger:     log,
				Configure: func(i int, cfg *node.Config) {
					simConfig(c, cfg)
					cfg.Policy = c.String("policy")
					cfg.OTLPEndpoint = c.String("otlp-endpoint")
				},
			}
			tn, err := testnet.Start(c.Context, tc)
			if err != nil {
				return err
			}
			wctx, cancel := context.WithTimeout(c.Context, 30*time.Second)
			err = tn.WaitConverged(wctx)
			cancel()
			if err != nil {
				log.Warn("mesh not converged yet", "err", err)
			}
			printNodes(os.Stdout, tn, c.StringSlice("roles"))
			fmt.Printf("\ntry:\n  curl -s %s/v1/chat/completions -d '{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}],\"stream\":true}'\n", tn.URLs()[0], node.DefaultModel)
			fmt.Printf("  bin/kvmesh status --node %s\n", tn.URLs()[0])
			fmt.Printf("  open %s/console in a browser\n", tn.URLs()[0])
			fmt.Fprintln(os.Stderr, "\nCtrl-C stops the mesh")
			<-c.Context.Done()
			fmt.Fprintln(os.Stderr, "stopping")
			return tn.Close()
		},
	}
}

// printNodes writes a testnet's table: each node's name, API URL, role (if any), gossip
// address and, with external engines, its engine's URL.
func printNodes(w io.Writer, tn *testnet.Net, roles []string) {
	engines, gossip := tn.EngineURLs(), tn.GossipAddrs()
	for i, u := range tn.URLs() {
		line := fmt.Sprintf("%s  %s", testnet.Name(i), u)
		if i < len(roles) && roles[i] != "" {
			line += "  " + roles[i]
		}
		line += "  gossip " + gossip[i]
		if i < len(engines) {
			line += "  engine " + engines[i]
		}
		fmt.Fprintln(w, line)
	}
}
