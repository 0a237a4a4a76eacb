package admit

import (
	"errors"
	"testing"
	"time"
)

func TestParsePriority(t *testing.T) {
	tests := []struct {
		in      string
		want    int
		wantErr bool
	}{
		{"", 0, false},
		{"normal", 0, false},
		{" HIGH ", PriorityHigh, false},
		{"low", PriorityLow, false},
		{"5", 5, false},
		{"-3", -3, false},
		{"1000", 1000, false},
		{"-1000", -1000, false},
		{"1001", 0, true},
		{"urgent", 0, true},
		{"1.5", 0, true},
		{"0x10", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParsePriority(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("ParsePriority(%q) err = %v, wantErr %v", tt.in, err, tt.wantErr)
			}
			if err != nil && !errors.Is(err, ErrHeader) {
				t.Errorf("error %v is not ErrHeader", err)
			}
			if got != tt.want {
				t.Errorf("ParsePriority(%q) = %d, want %d", tt.in, got, tt.want)
			}
		})
	}
}

func TestParseDuration(t *testing.T) {
	tests := []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{"250ms", 250 * time.Millisecond, false},
		{"1.5s", 1500 * time.Millisecond, false},
		{"2", 2 * time.Second, false},
		{"0.5", 500 * time.Millisecond, false},
		{" 3 ", 3 * time.Second, false},
		{"24h", 24 * time.Hour, false},
		{"86400", 24 * time.Hour, false},
		{"86401", 0, true},
		{"25h", 0, true},
		{"0", 0, true},
		{"0s", 0, true},
		{"-1", 0, true},
		{"-1s", 0, true},
		{"inf", 0, true},
		{"NaN", 0, true},
		{"1e3", 0, true},
		{"0x10", 0, true},
		{"", 0, true},
		{"soon", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseDuration(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("ParseDuration(%q) err = %v, wantErr %v", tt.in, err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("ParseDuration(%q) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

func FuzzParsePriority(f *testing.F) {
	for _, s := range []string{"", "high", "low", "normal", "-5", "1000", "1001", "\x00", "9999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePriority(s)
		if err != nil {
			if p != 0 || !errors.Is(err, ErrHeader) || len(err.Error()) > 300 {
				t.Fatalf("ParsePriority(%q) = %d, %v", s, p, err)
			}
			return
		}
		if p < -1000 || p > 1000 {
			t.Fatalf("ParsePriority(%q) = %d out of range", s, p)
		}
	})
}

func FuzzParseDuration(f *testing.F) {
	for _, s := range []string{"1s", "250ms", "2", "0.5", "-1", "inf", "1e9", "24h", "9223372036854775807ns", "."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDuration(s)
		if err != nil {
			if d != 0 || !errors.Is(err, ErrHeader) || len(err.Error()) > 300 {
				t.Fatalf("ParseDuration(%q) = %v, %v", s, d, err)
			}
			return
		}
		if d <= 0 || d > MaxHeaderDuration {
			t.Fatalf("ParseDuration(%q) = %v out of range", s, d)
		}
	})
}

func TestRetryAfterSeconds(t *testing.T) {
	for _, tt := range []struct {
		in   time.Duration
		want int
	}{{0, 1}, {time.Millisecond, 1}, {time.Second, 1}, {1001 * time.Millisecond, 2}, {59 * time.Second, 59}} {
		if got := RetryAfterSeconds(tt.in); got != tt.want {
			t.Errorf("RetryAfterSeconds(%v) = %d, want %d", tt.in, got, tt.want)
		}
	}
}
