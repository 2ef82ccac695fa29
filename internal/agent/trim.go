package agent

import (
	"runtime/debug"
	"sync"
	"time"
)

// The agent's memory is the sandbox's: what it holds counts against the
// sandbox's limit and is saved with every suspend, snapshot and fork (and
// read back at every wake). Output streams and file transfers turn over a
// buffer of up to a MiB per call; Go frees them at its next collection but
// gives the pages back to the kernel only gradually — an idle agent keeps
// them until its two-minute forced collection. So once traffic that moved
// trimBurst bytes has been quiet for trimAfter, the agent collects and
// returns its free memory at once.
const (
	trimAfter = time.Second
	trimBurst = 4 << 20
)

// trimmer returns the agent's free memory after a burst of traffic.
type trimmer struct {
	after time.Duration
	burst int
	free  func() // debug.FreeOSMemory

	mu    sync.Mutex
	moved int         // bytes carried since the last trim
	timer *time.Timer // armed once moved reaches burst
}

func newTrimmer() *trimmer {
	return &trimmer{after: trimAfter, burst: trimBurst, free: debug.FreeOSMemory}
}

// carried notes that a call carried n bytes; each call after the burst is
// reached puts the trim off until the traffic has been quiet for after.
func (t *trimmer) carried(n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.moved += n
	switch {
	case t.moved < t.burst:
	case t.timer == nil:
		t.timer = time.AfterFunc(t.after, t.trim)
	default:
		t.timer.Reset(t.after)
	}
}

func (t *trimmer) trim() {
	t.mu.Lock()
	t.moved, t.timer = 0, nil
	t.mu.Unlock()
	t.free()
}
