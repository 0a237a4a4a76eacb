package admit

import (
	"testing"
	"time"
)

// spread runs a client sending rate×load tokens per second of 100-token requests, round robin
// over the ingresses, for d, the ingresses exchanging their key usage every gossip period as
// their state records would; it returns the tokens accepted after warm (the first seconds
// fill the buckets' bursts) per second.
func spread(t *testing.T, ingresses int, rate, load float64, gossip, warm, d time.Duration) float64 {
	t.Helper()
	entries := []KeyEntry{{SHA256: HashKey("sk"), Tenant: "t", Rate: rate, Burst: int(rate)}}
	keys := make([]*Keys, ingresses)
	for i := range keys {
		k, err := NewKeys(entries, 0, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		keys[i] = k
	}
	st := func(i int) *keyState { return keys[i].lookup("sk") }
	const cost = 100
	every := time.Duration(float64(time.Second) * cost / (rate * load))
	accepted, next, lastGossip := 0, 0, t0
	for now := t0; now.Before(t0.Add(d)); now = now.Add(every) {
		if now.Sub(lastGossip) >= gossip {
			lastGossip = now
			usage := make([]map[uint64]float64, ingresses)
			for i := range keys {
				usage[i] = map[uint64]float64{}
				for _, u := range keys[i].Usage(now, 8) {
					usage[i][u.ID] = u.TokensPerSecond
				}
			}
			for i := range keys {
				remote := map[uint64]float64{}
				for j := range keys {
					if j != i {
						for id, r := range usage[j] {
							remote[id] += r
						}
					}
				}
				keys[i].SetRemote(now, remote)
			}
		}
		if _, ok := st(next).take(now, cost); ok && !now.Before(t0.Add(warm)) {
			accepted += cost
		}
		next = (next + 1) % ingresses
	}
	return float64(accepted) / (d - warm).Seconds()
}

// TestKeyRateHoldsAcrossTheMesh pins that a client spreading its requests over four ingresses
// at four times its key's rate is held near that rate in all (within 1.25×), with usage
// exchanged once a second as gossip does; without the exchange each ingress would grant the
// whole rate, four times it in all. Time is simulated: the figure is deterministic.
func TestKeyRateHoldsAcrossTheMesh(t *testing.T) {
	const rate = 2000.0
	got := spread(t, 4, rate, 4, time.Second, 5*time.Second, 35*time.Second)
	t.Logf("4 ingresses at 4× a %v tokens/s key: %.0f tokens/s accepted (%.2f× its rate)", rate, got, got/rate)
	if got > 1.25*rate {
		t.Errorf("%.0f tokens/s accepted, over 1.25× the key's %v", got, rate)
	}
	if got < 0.75*rate {
		t.Errorf("%.0f tokens/s accepted: the key is held well under its own rate %v", got, rate)
	}
	if none := spread(t, 4, rate, 4, time.Hour, 5*time.Second, 35*time.Second); none < 3*rate {
		t.Errorf("without the exchange: %.0f tokens/s, want about 4× the rate (the control)", none)
	}
	// One ingress alone grants the rate, whatever the exchange.
	if alone := spread(t, 1, rate, 4, time.Second, 5*time.Second, 35*time.Second); alone < 0.95*rate || alone > 1.05*rate {
		t.Errorf("one ingress: %.0f tokens/s, want %v", alone, rate)
	}
}

// TestRemoteUsageExpires: a remote figure not refreshed within RemoteTTL stops counting, so a
// departed ingress's last report cannot throttle a key; MinShare bounds any report.
func TestRemoteUsageExpires(t *testing.T) {
	var u meshUse
	u.setRemote(t0, 5000)
	if got := u.share(t0.Add(time.Second), 1000); got != 1000*MinShare {
		t.Errorf("share under a heavy remote figure = %v, want %v", got, 1000*MinShare)
	}
	if got := u.share(t0.Add(RemoteTTL+time.Second), 1000); got != 1000 {
		t.Errorf("share after the figure expired = %v, want the whole rate", got)
	}
}
