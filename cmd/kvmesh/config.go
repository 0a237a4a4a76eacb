package main

import (
	"fmt"
	"io"

	"github.com/urfave/cli/v2"

	"github.com/kvmesh/kvmesh/node"
)

func configCommand() *cli.Command {
	return &cli.Command{
		Name:  "config",
		Usage: "the node's config file",
		Subcommands: []*cli.Command{
			{
				Name:  "defaults",
				Usage: "print every setting at its default, as a config file to start from (kvmesh node --print-config prints a node's own)",
				Action: func(c *cli.Context) error {
					return printConfig(c.App.Writer, node.DefaultConfig())
				},
			},
		},
	}
}

// printConfig writes cfg as a config file, which kvmesh node --config reads back to cfg.
func printConfig(w io.Writer, cfg node.Config) error {
	b, err := node.MarshalConfigFile(cfg)
	if err != nil {
		return err
	}
	_, err = fmt.Fprint(w, string(b))
	return err
}
