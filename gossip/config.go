package gossip

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
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

// Config configures a Gossip member. The zero rule, as in every kvmesh config: a zero field
// means its default (DefaultConfig's value, or memberlist's for its timing knobs), which New
// fills in; a setting with an explicit other meaning names the negative value for it, never
// zero. The JSON names are the config file's (kvmesh node --config, section "gossip"); the
// name is the node's and the key is a secret, so neither has one.
type Config struct {
	// Name is this node's unique member name.
	Name string `json:"-"`
	// BindAddr and BindPort are where memberlist listens (UDP and TCP); defaults 0.0.0.0 and
	// 7946. BindPort AnyPort (-1) picks a free port; read it back with LocalAddr after Start.
	BindAddr string `json:"bind_addr"`
	BindPort int    `json:"bind_port"`
	// AdvertiseAddr and AdvertisePort are what peers dial; defaults the bound address and
	// port (an AdvertiseAddr alone is advertised with the bound port).
	AdvertiseAddr string `json:"advertise_addr"`
	AdvertisePort int    `json:"advertise_port"`
	// Join lists seed addresses (host:port). A failed join is retried in the background.
	Join []string `json:"join"`
	// Key is the AES key (16, 24 or 32 bytes) that encrypts and authenticates all gossip.
	// It may be nil only with Insecure.
	Key      []byte `json:"-"`
	Insecure bool   `json:"insecure"`

	// PublishInterval is the longest time between two state records (default 1s); a changed
	// state is published at the next flush, but not more often than MinPublishInterval
	// (default 200ms).
	PublishInterval    time.Duration `json:"publish_interval,advanced"`
	MinPublishInterval time.Duration `json:"min_publish_interval,advanced"`
	// MeshPublishInterval is the longest time between two records sent through memberlist's
	// gossip to the whole mesh; zero (the default) sizes it to what memberlist carries,
	// MeshInterval(PublishInterval, members). Once it is longer than PublishInterval, records
	// also go straight to the members of this node's prefix domains every PublishInterval, and
	// a peer outside them is stale only after three mesh intervals.
	MeshPublishInterval time.Duration `json:"mesh_publish_interval,advanced"`
	// FlushInterval is how often the local state is checked for change (default 50ms).
	FlushInterval time.Duration `json:"flush_interval,advanced"`
	// PrefixInterval is how often this node's prefix deltas, coalesced meanwhile, are sent
	// straight to every member of its prefix domains (default 500ms): the longer, the fewer
	// packets (each costs about 60 bytes besides its hashes) and the later a peer sees a prefix.
	PrefixInterval time.Duration `json:"prefix_interval,advanced"`
	// StaleAfter is the record age beyond which a peer is stale (default 3s).
	// A node gives both route's: the file has route.stale_after and route.stale_policy.
	StaleAfter  time.Duration `json:"-"`
	StalePolicy StalePolicy   `json:"-"`
	// MaxBytesPerSecond bounds the bytes this node sends (state records, its own and relayed,
	// and its prefix deltas and snapshots; default 64 KiB/s), over a bucket of one second's
	// worth that a prefix round may overdraw by two. Past it, messages wait; a backlog beyond
	// two seconds' worth is dropped, and the domain's members are sent this node's residency
	// again as the budget allows.
	MaxBytesPerSecond int `json:"max_bytes_per_second"`
	// PushPullInterval is the full state and snapshot exchange period (default 10s), and how
	// often the member tries to join again one member it holds dead, which heals a partition.
	PushPullInterval time.Duration `json:"push_pull_interval,advanced"`
	// MaxBlocksPerPeer bounds every peer's residency in the index and this node's snapshot
	// (default kvindex.DefaultMaxBlocksPerPeer).
	MaxBlocksPerPeer int `json:"max_blocks_per_peer,advanced"`
	// JoinRetryMax caps the backoff between join attempts (default 30s).
	JoinRetryMax time.Duration `json:"join_retry_max,advanced"`
	// DeadRetention is how long a dead or left member stays listed (default 5m).
	DeadRetention time.Duration `json:"dead_retention,advanced"`
	// LeaveTimeout is how long Close waits for the departure broadcast to go out (default 1s).
	// Negative: Close sends none, and peers find the node gone as after a crash (the failure
	// detector's time; for tests and benchmarks of it).
	LeaveTimeout time.Duration `json:"leave_timeout,advanced"`

	// memberlist timing knobs; zero keeps memberlist.DefaultLANConfig's value.
	ProbeInterval       time.Duration `json:"probe_interval,advanced"`
	ProbeTimeout        time.Duration `json:"probe_timeout,advanced"`
	GossipInterval      time.Duration `json:"gossip_interval,advanced"`
	GossipNodes         int           `json:"gossip_nodes,advanced"`
	SuspicionMult       int           `json:"suspicion_mult,advanced"`
	RetransmitMult      int           `json:"retransmit_mult,advanced"`
	TCPTimeout          time.Duration `json:"tcp_timeout,advanced"`
	DeadNodeReclaimTime time.Duration `json:"dead_node_reclaim_time,advanced"`

	// Drop, when set, is asked before every packet this member sends and every stream it
	// opens, with the gossip address (host:port) it goes to: true drops the packet, or fails
	// the stream, as a partitioned network would. Nil, the default, drops nothing. It is for
	// tests that cut members off (a partition, a frozen process); it must be fast and safe
	// for concurrent use.
	Drop func(to string) bool `json:"-"`

	// Logger receives gossip's and memberlist's logs (nil: discard).
	Logger *slog.Logger `json:"-"`
	// Registerer receives the metrics (nil: none).
	Registerer prometheus.Registerer `json:"-"`
}

// meshRecordLoad bounds the record traffic memberlist's gossip carries at its LAN timers (3
// members every 200 ms, one packet each), counted as members × ceil(log10(members+1)) a
// second: a record's retransmit limit up to the constant RetransmitMult, times the records.
// An empirical bound, set on testnet/scalemodel, where 32 members publishing every second keep
// records under 3 s old and 64 find 16% older.
const meshRecordLoad = 64

// MeshInterval is the mesh-wide record interval for a mesh of members, at least every: the
// period at which memberlist's gossip carries every member's record, members ×
// ceil(log10(members+1)) / meshRecordLoad seconds (1 s at 32 members, 2 s at 64, 62 s at 1,000).
func MeshInterval(every time.Duration, members int) time.Duration {
	if members <= 0 {
		return every
	}
	d := time.Duration(float64(time.Second) * float64(members) * math.Ceil(math.Log10(float64(members)+1)) / meshRecordLoad)
	return max(every, d)
}

// AnyPort as Config.BindPort binds a free port.
const AnyPort = -1

// DefaultConfig returns the defaults, with Name and Key still to be set.
func DefaultConfig() Config {
	return Config{
		BindAddr:           "0.0.0.0",
		BindPort:           7946,
		PublishInterval:    time.Second,
		MinPublishInterval: 200 * time.Millisecond,
		FlushInterval:      50 * time.Millisecond,
		PrefixInterval:     500 * time.Millisecond,
		StaleAfter:         3 * time.Second,
		StalePolicy:        FailClosed,
		MaxBytesPerSecond:  64 << 10,
		PushPullInterval:   10 * time.Second,
		JoinRetryMax:       30 * time.Second,
		DeadRetention:      5 * time.Minute,
		LeaveTimeout:       time.Second,
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
	if c.BindPort < AnyPort || c.BindPort > 65535 || c.AdvertisePort < 0 || c.AdvertisePort > 65535 {
		return fmt.Errorf("%w: port out of range", ErrConfig)
	}
	if c.BindAddr == "" {
		c.BindAddr = d.BindAddr
	}
	if c.BindPort == 0 {
		c.BindPort = d.BindPort
	}
	for _, v := range []time.Duration{c.PublishInterval, c.MinPublishInterval, c.MeshPublishInterval, c.FlushInterval, c.PrefixInterval,
		c.StaleAfter, c.PushPullInterval, c.JoinRetryMax, c.DeadRetention, c.ProbeInterval, c.ProbeTimeout, c.GossipInterval,
		c.TCPTimeout, c.DeadNodeReclaimTime} {
		if v < 0 {
			return fmt.Errorf("%w: negative interval %v", ErrConfig, v)
		}
	}
	if c.MaxBytesPerSecond < 0 || c.MaxBlocksPerPeer < 0 || c.GossipNodes < 0 || c.SuspicionMult < 0 || c.RetransmitMult < 0 {
		return fmt.Errorf("%w: negative size", ErrConfig)
	}
	def := func(v *time.Duration, dv time.Duration) {
		if *v == 0 {
			*v = dv
		}
	}
	def(&c.PublishInterval, d.PublishInterval)
	def(&c.MinPublishInterval, d.MinPublishInterval)
	def(&c.FlushInterval, d.FlushInterval)
	def(&c.PrefixInterval, d.PrefixInterval)
	def(&c.StaleAfter, d.StaleAfter)
	def(&c.PushPullInterval, d.PushPullInterval)
	def(&c.JoinRetryMax, d.JoinRetryMax)
	def(&c.DeadRetention, d.DeadRetention)
	def(&c.LeaveTimeout, d.LeaveTimeout)
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
	if c.MaxBytesPerSecond == 0 {
		c.MaxBytesPerSecond = d.MaxBytesPerSecond
	}
	if c.MaxBytesPerSecond < 2*maxMessage {
		return fmt.Errorf("%w: MaxBytesPerSecond %d below %d", ErrConfig, c.MaxBytesPerSecond, 2*maxMessage)
	}
	return nil
}
