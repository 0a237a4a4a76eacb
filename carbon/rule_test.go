package carbon

import (
	"slices"
	"testing"
)

func TestDecide(t *testing.T) {
	clean := Option{Name: "clean", HasRoom: true}
	cleanFull := Option{Name: "clean-full"}
	dirty := Option{Name: "dirty", Dirty: true, HasRoom: true}
	clean2 := Option{Name: "clean2", HasRoom: true}
	tests := []struct {
		name       string
		priority   int
		localDirty bool
		others     []Option
		want       Action
		wantPeers  []string
	}{
		{"normal on dirty node, nowhere clean", 0, true, nil, ActionAny, nil},
		{"high on dirty node", 10, true, []Option{dirty}, ActionAny, nil},
		{"low on clean node", -1, false, []Option{dirty, clean}, ActionLocal, []string{"clean"}},
		{"low on clean node alone", -1, false, nil, ActionLocal, nil},
		{"low on dirty node, clean peer", -1, true, []Option{dirty, clean}, ActionRoute, []string{"clean"}},
		{"low keeps given order", -5, true, []Option{clean2, dirty, clean}, ActionRoute, []string{"clean2", "clean"}},
		{"low, clean peer full", -1, true, []Option{cleanFull, dirty}, ActionDefer, nil},
		{"low, all dirty", -1, true, []Option{dirty}, ActionDefer, nil},
		{"low, no peers", -100, true, nil, ActionDefer, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Decide(tt.priority, tt.localDirty, tt.others)
			if d.Action != tt.want || !slices.Equal(d.Peers, tt.wantPeers) {
				t.Fatalf("Decide = %+v (%s), want %s peers %v", d, d.Action, tt.want, tt.wantPeers)
			}
			if (d.Action == ActionDefer) != (d.Reason == ReasonDeferred) {
				t.Fatalf("reason %q with action %s", d.Reason, d.Action)
			}
		})
	}
}

func TestConfigDirty(t *testing.T) {
	open, closed := Config{Threshold: 300, FailMode: FailOpen}, Config{Threshold: 300, FailMode: FailClosed}
	tests := []struct {
		name           string
		cfg            Config
		intensity      float64
		failModeActive bool
		want           bool
	}{
		{"fresh above threshold, open", open, 301, false, true},
		{"fresh above threshold, closed", closed, 301, false, true},
		{"fresh at threshold is clean", closed, 300, false, false},
		{"fresh below threshold, closed", closed, 120, false, false},
		{"no fresh reading, open ignores a dirty figure", open, 900, true, false},
		{"no fresh reading, closed ignores a clean figure", closed, 0, true, true},
		{"zero config, zero intensity", Config{}, 0, false, false},
		{"zero config, any positive intensity", Config{}, 1, false, true},
		{"zero config fails open", Config{}, 900, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.cfg.Dirty(tt.intensity, tt.failModeActive); got != tt.want {
				t.Fatalf("Dirty(%v, %v) = %v, want %v", tt.intensity, tt.failModeActive, got, tt.want)
			}
		})
	}
}
