// Command kvmesh is the kvmesh binary: a node, the embedded engine served alone, a local
// testnet, the load generator and benchmark, the cluster CA, a status view and a health check.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/kvmesh/kvmesh/node"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newApp().RunContext(ctx, os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "kvmesh:", err)
		os.Exit(1)
	}
}

func newApp() *cli.App {
	return &cli.App{
		Name:    "kvmesh",
		Usage:   "peer-to-peer admission and routing mesh for LLM inference",
		Version: node.Version,
		// Bash and zsh completion ask the binary for the next words (kvmesh completion).
		EnableBashCompletion: true,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error", EnvVars: env("log-level")},
			&cli.StringFlag{Name: "log-format", Value: "text", Usage: "text or json", EnvVars: env("log-format")},
		},
		Commands: []*cli.Command{
			nodeCommand(),
			engineCommand(),
			testnetCommand(),
			statusCommand(),
			healthCommand(),
			loadCommand(),
			benchCommand(),
			caCommand(),
			configCommand(),
			versionCommand(),
			completionCommand(),
		},
	}
}

// env names a flag's environment variable: --gossip-key is KVMESH_GOSSIP_KEY.
func env(flag string) []string {
	return []string{"KVMESH_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))}
}

func newLogger(c *cli.Context) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.String("log-level"))); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch c.String("log-format") {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	default:
		return nil, fmt.Errorf("--log-format must be text or json, not %q", c.String("log-format"))
	}
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print the version",
		Action: func(c *cli.Context) error {
			fmt.Println("kvmesh", node.Version)
			return nil
		},
	}
}
