package main

import (
	"fmt"
	"io"

	"github.com/urfave/cli/v2"

	"github.com/kvmesh/kvmesh/node/nodeconfig"
)

func configCommand() *cli.Command {
	return &cli.Command{
		Name:  "config",
		Usage: "the node's config file",
		Subcommands: []*cli.Command{
			{
				Name:  "defaults",
				Usage: "print every setting at its default, as a config file to start from (kvmesh node --print-config prints a node's own)",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "format", Value: "json", Usage: "json or yaml", EnvVars: env("config-format")},
				},
				Action: func(c *cli.Context) error {
					return printConfig(c.App.Writer, nodeconfig.DefaultConfig(), c.String("format"))
				},
			},
		},
	}
}

// printConfig writes cfg as a config file in format (json or yaml), which kvmesh node --config
// reads back to cfg.
func printConfig(w io.Writer, cfg nodeconfig.Config, format string) error {
	marshal := nodeconfig.MarshalConfigFile
	switch format {
	case "json":
	case "yaml":
		marshal = nodeconfig.MarshalConfigFileYAML
	default:
		return fmt.Errorf("--format must be json or yaml, not %q", format)
	}
	b, err := marshal(cfg)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}
