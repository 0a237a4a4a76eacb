package main

import (
	"maps"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kvmesh/kvmesh/node/engine/sim"
)

// parseEngineLoRA runs kvmesh engine's flag parsing for args and returns the LoRA config.
func parseEngineLoRA(t *testing.T, args ...string) (sim.Config, error) {
	t.Helper()
	var cfg sim.Config
	var cerr error
	cmd := engineCommand()
	cmd.Action = func(c *cli.Context) error {
		cerr = loraConfig(c, &cfg)
		return nil
	}
	app := &cli.App{Commands: []*cli.Command{cmd}}
	if err := app.Run(append([]string{"kvmesh", "engine"}, args...)); err != nil {
		t.Fatal(err)
	}
	return cfg, cerr
}

func TestEngineLoRAFlags(t *testing.T) {
	cfg, err := parseEngineLoRA(t, "--lora-modules", "a=/lora/a", "--lora-modules", "b=s3://x/b", "--max-loras", "2", "--lora-load-time", "1s")
	want := map[string]string{"a": "/lora/a", "b": "s3://x/b"}
	if err != nil || !maps.Equal(cfg.LoRAModules, want) || cfg.MaxLoRAs != 2 || cfg.LoRALoadTime != time.Second {
		t.Errorf("got %v %d %v, err %v", cfg.LoRAModules, cfg.MaxLoRAs, cfg.LoRALoadTime, err)
	}
	for _, bad := range []string{"a", "=p", "a="} {
		if _, err := parseEngineLoRA(t, "--lora-modules", bad); err == nil {
			t.Errorf("--lora-modules %q accepted", bad)
		}
	}
}
