package gossip

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// StalePolicy says what a peer whose last state record is older than StaleAfter means.
type StalePolicy string

const (
	// FailClosed (the default): a stale peer is not a routing candidate. Its load is unknown,
	// and sending work to a peer that may be overloaded or gone costs a forward and a retry,
	// while skipping it costs only a little prefix reuse.
	FailClosed StalePolicy = "closed"
	// FailOpen: a stale peer stays a candidate at its last known load.
	FailOpen StalePolicy = "open"
)

// Config configures a Gossip member. Zero durations and sizes take the defaults below.
type Config struct {
	// Name is this node's unique member name.
	Name string
	// BindAddr and BindPort are where memberlist listens (UDP and TCP). Port 0 picks one; read
	// it back with LocalAddr after Start.
	BindAddr string
	BindPort int
	// AdvertiseAddr and AdvertisePort are what peers dial, if not the bound address.
	AdvertiseAddr string
	AdvertisePort int
	// Join lists seed addresses (host:port). A failed join is retried in the background.
	Join []string
	// Key is the AES key (16, 24 or 32 bytes) that encrypts and authenticates all gossip.
	// It may be nil only with Insecure.
	Key      []byte
	Insecure bool

	// PublishInterval is the longest time between two state records (default 1s); a changed
	// state is published at the next flush, but not more often than MinPublishInterval
	// (default 200ms).
	PublishInterval    time.Duration
	MinPublishInterval time.Duration
	// FlushInterval is how often queued prefix deltas are coalesced into messages and the
	// local state is checked for change (default 50ms).
	FlushInterval time.Duration
	// StaleAfter is the record age beyond which a peer is stale (default 3s).
	StaleAfter  time.Duration
	StalePolicy StalePolicy
	// MaxBytesPerSecond bounds this node's broadcast bytes (own and relayed, default 64 KiB/s).
	// Past it, messages wait; a backlog beyond two seconds' worth is pruned (deltas lost that
	// way are repaired by the next push/pull snapshot).
	MaxBytesPerSecond int
	// PushPullInterval is the full state and snapshot exchange period (default 10s).
	PushPullInterval time.Duration
	// MaxBlocksPerPeer bounds every peer's residency in the index and this node's snapshot
	// (default kvindex.DefaultMaxBlocksPerPeer).
	MaxBlocksPerPeer int
	// JoinRetryMax caps the backoff between join attempts (default 30s).
	JoinRetryMax time.Duration
	// DeadRetention is how long a dead or left member stays listed (default 5m).
	DeadRetention time.Duration

	// memberlist timing knobs; zero keeps memberlist.DefaultLANConfig's value.
	ProbeInterval       time.Duration
	ProbeTimeout        time.Duration
	GossipInterval      time.Duration
	GossipNodes         int
	SuspicionMult       int
	RetransmitMult      int
	TCPTimeout          time.Duration
	DeadNodeReclaimTime time.Duration

	// Logger receives gossip's and memberlist's logs (nil: discard).
	Logger *slog.Logger
	// Registerer receives the metrics (nil: none).
	Registerer prometheus.Registerer
}

// DefaultConfig returns the defaults, with Name and Key still to be set.
func DefaultConfig() Config {
	return Config{
		BindAddr:           "0.0.0.0",
		BindPort:           7946,
		PublishInterval:    time.Second,
		MinPublishInterval: 200 * time.Millisecond,
		FlushInterval:      50 * time.Millisecond,
		StaleAfter:         3 * time.Second,
		StalePolicy:        FailClosed,
		MaxBytesPerSecond:  64 << 10,
		PushPullInterval:   10 * time.Second,
		JoinRetryMax:       30 * time.Second,
		DeadRetention:      5 * time.Minute,
	}
}

// ErrConfig wraps every configuration error.
var ErrConfig = errors.New("gossip: invalid config")

func (c *Config) validate() error {
	d := DefaultConfig()
	if c.Name == "" {
		return fmt.Errorf("%w: empty name", ErrConfig)
	}
	switch len(c.Key) {
	case 0:
		if !c.Insecure {
			return fmt.Errorf("%w: a gossip key is required unless insecure", ErrConfig)
		}
	case 16, 24, 32:
	default:
		return fmt.Errorf("%w: key of %d bytes, want 16, 24 or 32", ErrConfig, len(c.Key))
	}
	if c.BindPort < 0 || c.BindPort > 65535 || c.AdvertisePort < 0 || c.AdvertisePort > 65535 {
		return fmt.Errorf("%w: port out of range", ErrConfig)
	}
	if c.BindAddr == "" {
		c.BindAddr = d.BindAddr
	}
	def := func(v *time.Duration, dv time.Duration) {
		if *v <= 0 {
			*v = dv
		}
	}
	def(&c.PublishInterval, d.PublishInterval)
	def(&c.MinPublishInterval, d.MinPublishInterval)
	def(&c.FlushInterval, d.FlushInterval)
	def(&c.StaleAfter, d.StaleAfter)
	def(&c.PushPullInterval, d.PushPullInterval)
	def(&c.JoinRetryMax, d.JoinRetryMax)
	def(&c.DeadRetention, d.DeadRetention)
	if c.MinPublishInterval > c.PublishInterval {
		c.MinPublishInterval = c.PublishInterval
	}
	switch c.StalePolicy {
	case "":
		c.StalePolicy = FailClosed
	case FailClosed, FailOpen:
	default:
		return fmt.Errorf("%w: stale policy %q", ErrConfig, c.StalePolicy)
	}
	if c.MaxBytesPerSecond <= 0 {
		c.MaxBytesPerSecond = d.MaxBytesPerSecond
	}
	if c.MaxBytesPerSecond < 2*maxMessage {
		return fmt.Errorf("%w: MaxBytesPerSecond %d below %d", ErrConfig, c.MaxBytesPerSecond, 2*maxMessage)
	}
	return nil
}
