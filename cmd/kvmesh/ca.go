package main

import (
	"fmt"

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
					fmt.Println("CA written to", c.String("dir"))
					return nil
				},
			},
			{
				Name:  "issue",
				Usage: "issue a node certificate (NAME.crt, NAME.key) signed by the CA in --dir",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "dir", Required: true, Usage: "directory holding the CA", EnvVars: env("ca-dir")},
					&cli.StringFlag{Name: "node", Required: true, Usage: "node name (the certificate's name)", EnvVars: env("ca-node")},
					&cli.StringSliceFlag{Name: "host", Usage: "extra IP or DNS name for the certificate (repeatable)", EnvVars: env("ca-host")},
				},
				Action: func(c *cli.Context) error {
					if err := transport.IssueNode(c.String("dir"), c.String("node"), c.StringSlice("host")); err != nil {
						return err
					}
					fmt.Printf("certificate for %s written to %s\n", c.String("node"), c.String("dir"))
					return nil
				},
			},
		},
	}
}
