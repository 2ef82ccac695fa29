package agent

import (
	"testing"
	"time"
)

// The wait before a read lets a streaming pipe fill about halfway at the
// rate it has been filling, never past coalesceFor, and shrinks at once
// when a read found the pipe nearly full (the writer may have waited for
// room).
func TestCoalesceWaitLetsThePipeFillHalfway(t *testing.T) {
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	for _, c := range []struct {
		name      string
		n         int
		gap, prev time.Duration
		want      time.Duration
	}{
		{"nothing read yet", 0, ms(3), coalesceFor, coalesceFor},
		{"a slow trickle waits the most", 8 << 10, ms(5), coalesceFor, coalesceFor},
		{"head -c: 256 KiB in 2 ms", 256 << 10, ms(2), ms(2), ms(4)},
		{"half the pipe in 5 ms", pipeSize / 2, ms(5), ms(5), ms(5)},
		{"nearly full after a wait of 10 ms that overran", pipeSize, ms(14), coalesceFor, ms(5)},
		{"nearly full after a short wait", pipeSize * 7 / 8, ms(3), ms(2), ms(1)},
		{"dd bs=1M: full pipes back to back", pipeSize, ms(1.4), 0, 0},
	} {
		if got := coalesceWait(c.n, c.gap, c.prev); got != c.want {
			t.Errorf("%s: coalesceWait(%d, %v, %v) = %v, want %v", c.name, c.n, c.gap, c.prev, got, c.want)
		}
	}
}
