package main

import (
	"fmt"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/kvmesh/kvmesh/node/transport"
)

func caCommand() *cli.Command {
	return &cli.Command{
		Name:  "ca",
		Usage: "manage the cluster CA that signs node certificates for QUIC mTLS",
		Subcommands: []*cli.Command{
			{
				Name:  "init",
				Usage: "create a CA (ca.crt, ca.key) in --dir",
				Flags: []cli.Flag{&cli.StringFlag{Name: "dir", Required: true, Usage: "directory for the CA files", EnvVars: env("ca-dir")}},
				Action: func(c *cli.Context) error {
					if err := transport.InitCA(c.String("dir")); err != nil {
						return err
					}
					fmt.Printf("CA written to %s (ca.crt, ca.key): keep ca.key here, off the nodes\n", c.String("dir"))
					return nil
				},
			},
			{
				Name:  "issue",
				Usage: "issue a node certificate signed by the CA in --dir, into a directory for that node alone (ca.crt, NAME.crt, NAME.key)",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "dir", Required: true, Usage: "directory holding the CA", EnvVars: env("ca-dir")},
					&cli.StringFlag{Name: "node", Required: true, Usage: "node name (the certificate's name)", EnvVars: env("ca-node")},
					&cli.StringSliceFlag{Name: "host", Usage: "extra IP or DNS name for the certificate (repeatable)", EnvVars: env("ca-host")},
					&cli.StringFlag{Name: "out", Usage: "the node's directory, its --tls-dir (default: NAME inside --dir); never the CA's own", EnvVars: env("ca-out")},
					&cli.BoolFlag{Name: "any-name", Usage: "a certificate every node may present whatever its --name (one for all pods); peers cannot tell its holders apart", EnvVars: env("ca-any-name")},
				},
				Action: func(c *cli.Context) error {
					name, out := c.String("node"), c.String("out")
					if out == "" {
						out = filepath.Join(c.String("dir"), name)
					}
					issue := transport.IssueNode
					if c.Bool("any-name") {
						issue = transport.IssueAnyNode
					}
					if err := issue(c.String("dir"), out, name, c.StringSlice("host")); err != nil {
						return err
					}
					fmt.Printf("certificate for %s written to %s (ca.crt, %s.crt, %s.key): copy that directory to the node as its --tls-dir\n", name, out, name, name)
					return nil
				},
			},
		},
	}
}
