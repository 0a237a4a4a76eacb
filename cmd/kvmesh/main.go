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
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go stopOnSignals(sigs, cancel, func(s os.Signal) {
		fmt.Fprintf(os.Stderr, "kvmesh: second signal (%v): exiting now, without waiting for the drain\n", s)
		os.Exit(exitCode(s))
	})
	if err := newApp().RunContext(ctx, os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "kvmesh:", err)
		os.Exit(1)
	}
}

// stopOnSignals cancels the command's context at the first signal from sigs, asking it to
// stop in order (a node drains), and calls force at the second: an operator who sends
// another does not want to wait.
func stopOnSignals(sigs <-chan os.Signal, cancel context.CancelFunc, force func(os.Signal)) {
	<-sigs
	cancel()
	force(<-sigs)
}

// exitCode is the status of a process ended by s, as a shell reports one killed by it: 128
// plus the signal's number (130 for SIGINT, 143 for SIGTERM).
func exitCode(s os.Signal) int {
	if n, ok := s.(syscall.Signal); ok {
		return 128 + int(n)
	}
	return 1
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
