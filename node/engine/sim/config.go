package sim

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node/engine"
)

// Config configures a Sim. The defaults model Llama-3.1-8B in BF16 on one H100 SXM 80 GB
// (see the package doc for where each number comes from). The zero rule, as in every kvmesh
// config: a zero field means its default (DefaultConfig's value), which New fills in, so
// Config{} is DefaultConfig(). The JSON names are the config file's (kvmesh node --config,
// section "sim"); the node sets the models, hooks and logger itself.
type Config struct {
	// Models served. Default: one model "llama-3.1-8b" with a 131072-token context.
	Models []engine.Model `json:"-"`
	// BlockTokens is the KV block size in tokens. Default kvindex.DefaultBlockTokens.
	BlockTokens int `json:"block_tokens,advanced"`
	// KVBlocks is the size of the KV pool in blocks. 0 derives it from the GPU memory inputs
	// below: (GPUMemoryBytes × GPUMemoryUtilization − WeightBytes) / (KVBytesPerToken × BlockTokens).
	KVBlocks int `json:"kv_blocks"`
	// Inputs of the derived pool size.
	GPUMemoryBytes       int64   `json:"gpu_memory_bytes,advanced"`
	GPUMemoryUtilization float64 `json:"gpu_memory_utilization,advanced"`
	WeightBytes          int64   `json:"weight_bytes,advanced"`
	KVBytesPerToken      int64   `json:"-"`
	// MaxNumBatchedTokens is the per-step token budget (vLLM max_num_batched_tokens). The
	// default, 2048, is sized to the TPOT SLO rather than to throughput: a step carrying a full
	// prefill chunk takes 5 ms + 2048 × 30 µs ≈ 66 ms, so a sequence decoding beside it stays
	// within kvmesh's 100 ms interactive TPOT with room for the batch's context term (vLLM's
	// tuning guide gives the same value for inter-token latency). At 8192, vLLM's default on
	// an 80 GB GPU, that step takes 250 ms, and no routing keeps a short reply's TPOT beside
	// a long prefill; prefill throughput is 31k tokens/s instead of 33k.
	MaxNumBatchedTokens int `json:"max_num_batched_tokens"`
	// MaxNumSeqs caps running sequences (vLLM max_num_seqs).
	MaxNumSeqs int `json:"max_num_seqs,advanced"`
	// Step time = StepFixed + StepPerToken·(tokens computed in the step) +
	// StepPerContextToken·(context tokens of every sequence in the batch). Each is positive
	// once filled: 0 takes the default, so no term can be switched off (1ns is as good as none).
	StepFixed           time.Duration `json:"step_fixed,advanced"`
	StepPerToken        time.Duration `json:"step_per_token,advanced"`
	StepPerContextToken time.Duration `json:"step_per_context_token,advanced"`
	// TimeScale runs the simulator this many times faster than real time: a step sleeps
	// stepTime/TimeScale. Default 1.
	TimeScale float64 `json:"time_scale,advanced"`
	// HitRateWindow is how many recent prompt tokens State's HitRate covers. Default 65536.
	HitRateWindow int `json:"hit_rate_window,advanced"`
	// Role is the engine's part in disaggregated prefill and decode: RoleMixed (the default)
	// runs requests whole and decodes handovers, RolePrefill computes a request's prompt KV
	// and ends it with a handover, RoleDecode decodes handovers and runs a request without
	// one whole (see roles.go). A node gives it its own role (the file's node.role).
	Role string `json:"-"`
	// LinkGBps is the bandwidth, in GB/s (1e9 bytes a second), of the link a handover's KV
	// crosses to this engine: a handover waits KVBytes / LinkGBps before it may decode.
	// Default 25, an RDMA-class link (200 Gb/s InfiniBand or RoCE). A node gives it, and
	// KVBytesPerToken, route's (the file's route.link_gbps and route.kv_bytes_per_token).
	LinkGBps float64 `json:"-"`
	// SchedulingPolicy is vLLM's --scheduling-policy: SchedulingPriority (the default) orders
	// the waiting queue, the running batch and preemption by Request.Priority, then arrival;
	// SchedulingFCFS ignores Request.Priority, so every request is scheduled by arrival alone
	// and a preemption takes the latest arrival, as vLLM's and SGLang's default policy does.
	SchedulingPolicy string `json:"scheduling_policy"`
	// LoRAModules are the LoRA adapters the engine knows from its start, name → path (vLLM
	// --lora-modules), each an adapter of the first model. POST /v1/load_lora_adapter (the
	// node's standalone engine) or LoadAdapter adds more at run time; the sim reads no file,
	// so any path loads.
	LoRAModules map[string]string `json:"lora_modules,advanced"`
	// MaxLoRAs is the number of GPU adapter slots, the most distinct adapters one batch holds
	// (vLLM --max-loras). Default 4.
	MaxLoRAs int `json:"max_loras,advanced"`
	// LoRALoadTime is the simulated time to bring an adapter into a GPU slot: a runtime load
	// takes it before it answers, and the step that first batches an adapter not resident adds
	// it. Default 200ms.
	LoRALoadTime time.Duration `json:"lora_load_time,advanced"`
	// StepPerLoRA is added to a step for each distinct adapter in its batch: the LoRA kernels
	// gather each adapter's weights apart. Default 1ms.
	StepPerLoRA time.Duration `json:"step_per_lora,advanced"`
	// OnPrefix, if set, is called from the step loop with the block hashes newly stored in and
	// evicted from the prefix cache, and the anchors among them (each block's position is that
	// of the chain it was stored from). It must not block and must not keep the slices.
	OnPrefix func(kvindex.CacheDelta) `json:"-"`
	// Registerer receives the vLLM-named metrics; nil registers none.
	Registerer prometheus.Registerer `json:"-"`
	// Logger; nil discards.
	Logger *slog.Logger `json:"-"`
}

// Scheduling policies of Config.SchedulingPolicy, named as vLLM's --scheduling-policy values.
const (
	SchedulingPriority = "priority"
	SchedulingFCFS     = "fcfs"
)

// SchedulingPolicies lists the values of Config.SchedulingPolicy.
var SchedulingPolicies = []string{SchedulingPriority, SchedulingFCFS}

// DefaultConfig returns the Llama-3.1-8B on H100 SXM 80 GB configuration.
func DefaultConfig() Config {
	return Config{
		Models:               []engine.Model{{Name: "llama-3.1-8b", ContextTokens: 131072}},
		BlockTokens:          kvindex.DefaultBlockTokens,
		GPUMemoryBytes:       80 << 30,
		GPUMemoryUtilization: 0.9,
		WeightBytes:          16_060_000_000, // 8.03e9 parameters × 2 bytes (BF16)
		KVBytesPerToken:      2 * 32 * 8 * 128 * 2,
		MaxNumBatchedTokens:  2048,
		MaxNumSeqs:           256,
		StepFixed:            5 * time.Millisecond,
		StepPerToken:         30 * time.Microsecond,
		StepPerContextToken:  40 * time.Nanosecond,
		TimeScale:            1,
		HitRateWindow:        65536,
		Role:                 RoleMixed,
		LinkGBps:             25,
		SchedulingPolicy:     SchedulingPriority,
		MaxLoRAs:             4,
		LoRALoadTime:         200 * time.Millisecond,
		StepPerLoRA:          time.Millisecond,
	}
}

// fill sets every zero field to its default (the zero rule).
func (c *Config) fill() {
	d := DefaultConfig()
	if c.Models == nil {
		c.Models = d.Models
	}
	setI := func(v *int, def int) {
		if *v == 0 {
			*v = def
		}
	}
	setI64 := func(v *int64, def int64) {
		if *v == 0 {
			*v = def
		}
	}
	setD := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	setI(&c.BlockTokens, d.BlockTokens)
	setI64(&c.GPUMemoryBytes, d.GPUMemoryBytes)
	if c.GPUMemoryUtilization == 0 {
		c.GPUMemoryUtilization = d.GPUMemoryUtilization
	}
	setI64(&c.WeightBytes, d.WeightBytes)
	setI64(&c.KVBytesPerToken, d.KVBytesPerToken)
	setI(&c.MaxNumBatchedTokens, d.MaxNumBatchedTokens)
	setI(&c.MaxNumSeqs, d.MaxNumSeqs)
	setD(&c.StepFixed, d.StepFixed)
	setD(&c.StepPerToken, d.StepPerToken)
	setD(&c.StepPerContextToken, d.StepPerContextToken)
	if c.TimeScale == 0 {
		c.TimeScale = d.TimeScale
	}
	setI(&c.HitRateWindow, d.HitRateWindow)
	if c.Role == "" {
		c.Role = d.Role
	}
	if c.LinkGBps == 0 {
		c.LinkGBps = d.LinkGBps
	}
	if c.SchedulingPolicy == "" {
		c.SchedulingPolicy = d.SchedulingPolicy
	}
	setI(&c.MaxLoRAs, d.MaxLoRAs)
	setD(&c.LoRALoadTime, d.LoRALoadTime)
	setD(&c.StepPerLoRA, d.StepPerLoRA)
}

// ErrConfig wraps every configuration error New returns.
var ErrConfig = errors.New("sim: invalid config")

// kvBlocks returns the pool size: KVBlocks if set, else derived from the memory inputs.
func (c *Config) kvBlocks() (int, error) {
	if c.KVBlocks > 0 {
		return c.KVBlocks, nil
	}
	if c.GPUMemoryBytes <= 0 || c.KVBytesPerToken <= 0 || c.WeightBytes < 0 ||
		c.GPUMemoryUtilization <= 0 || c.GPUMemoryUtilization > 1 {
		return 0, fmt.Errorf("%w: KVBlocks unset and GPU memory inputs invalid", ErrConfig)
	}
	kv := float64(c.GPUMemoryBytes)*c.GPUMemoryUtilization - float64(c.WeightBytes)
	n := int(kv / float64(c.KVBytesPerToken*int64(c.BlockTokens)))
	if n < 1 {
		return 0, fmt.Errorf("%w: weights leave no memory for the KV cache", ErrConfig)
	}
	return n, nil
}

func (c *Config) validate() error {
	if len(c.Models) == 0 {
		return fmt.Errorf("%w: no models", ErrConfig)
	}
	seen := make(map[string]bool, len(c.Models))
	for _, m := range c.Models {
		if m.Name == "" || m.ContextTokens < 1 || seen[m.Name] {
			return fmt.Errorf("%w: model %q: empty, duplicate or without context", ErrConfig, m.Name)
		}
		seen[m.Name] = true
	}
	switch {
	case c.BlockTokens < 1:
		return fmt.Errorf("%w: BlockTokens %d < 1", ErrConfig, c.BlockTokens)
	case c.KVBlocks < 0:
		return fmt.Errorf("%w: KVBlocks %d < 0", ErrConfig, c.KVBlocks)
	case c.MaxNumBatchedTokens < 1:
		return fmt.Errorf("%w: MaxNumBatchedTokens %d < 1", ErrConfig, c.MaxNumBatchedTokens)
	case c.MaxNumSeqs < 1:
		return fmt.Errorf("%w: MaxNumSeqs %d < 1", ErrConfig, c.MaxNumSeqs)
	case c.StepFixed < 0 || c.StepPerToken < 0 || c.StepPerContextToken < 0:
		return fmt.Errorf("%w: negative step time coefficient", ErrConfig)
	case c.StepFixed+c.StepPerToken <= 0:
		return fmt.Errorf("%w: a step must take time (StepFixed + StepPerToken > 0)", ErrConfig)
	case !(c.TimeScale > 0):
		return fmt.Errorf("%w: TimeScale %v must be > 0", ErrConfig, c.TimeScale)
	case c.HitRateWindow < 1:
		return fmt.Errorf("%w: HitRateWindow %d < 1", ErrConfig, c.HitRateWindow)
	case c.Role != RoleMixed && c.Role != RolePrefill && c.Role != RoleDecode:
		return fmt.Errorf("%w: Role %q is not mixed, prefill or decode", ErrConfig, c.Role)
	case !(c.LinkGBps > 0):
		return fmt.Errorf("%w: LinkGBps %v must be > 0", ErrConfig, c.LinkGBps)
	case !slices.Contains(SchedulingPolicies, c.SchedulingPolicy):
		return fmt.Errorf("%w: SchedulingPolicy %q is not %s or %s", ErrConfig, c.SchedulingPolicy, SchedulingPriority, SchedulingFCFS)
	case c.MaxLoRAs < 1:
		return fmt.Errorf("%w: MaxLoRAs %d < 1", ErrConfig, c.MaxLoRAs)
	case c.LoRALoadTime < 0 || c.StepPerLoRA < 0:
		return fmt.Errorf("%w: negative LoRA time", ErrConfig)
	}
	for name, path := range c.LoRAModules {
		if name == "" || path == "" || seen[name] {
			return fmt.Errorf("%w: LoRA module %q: empty name or path, or a base model's name", ErrConfig, name)
		}
	}
	return nil
}
