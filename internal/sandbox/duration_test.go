package sandbox

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestFormatDurationReadsLikeInput(t *testing.T) {
	for d, want := range map[time.Duration]string{
		10 * time.Minute:                   "10m",
		time.Hour:                          "1h",
		90 * time.Minute:                   "1h30m",
		720 * time.Hour:                    "720h",
		90 * time.Second:                   "1m30s",
		45 * time.Second:                   "45s",
		1500 * time.Millisecond:            "1.5s",
		time.Hour + time.Second:            "1h0m1s",
		250 * time.Millisecond:             "250ms",
		0:                                  "0s",
		2*time.Hour + 500*time.Millisecond: "2h0m0.5s",
	} {
		if got := FormatDuration(d); got != want {
			t.Errorf("FormatDuration(%v) = %q, want %q", d, got, want)
		}
	}
	// Whatever it writes parses back to the same duration.
	for range 10000 {
		d := time.Duration(rand.Int64N(int64(1000 * time.Hour)))
		if rand.IntN(2) == 0 {
			d = d.Truncate(time.Minute)
		}
		back, err := time.ParseDuration(FormatDuration(d))
		if err != nil || back != d {
			t.Fatalf("FormatDuration(%v) = %q parses as %v, %v", d, FormatDuration(d), back, err)
		}
	}
}
