package agent

import (
	"sync/atomic"
	"testing"
	"time"
)

// The trim's timing, with a counter standing in for debug.FreeOSMemory
// (whose effect is measured on real sandboxes: see trim.go).
func TestTrimmerFreesOnceAfterAQuietBurstWithACountingFree(t *testing.T) {
	var freed atomic.Int32
	// Calls come every 20 ms, well inside after (a loaded host under -race
	// may sleep longer than asked).
	tr := &trimmer{after: 300 * time.Millisecond, burst: 1000, free: func() { freed.Add(1) }}

	tr.carried(999) // below the burst: nothing to give back
	time.Sleep(700 * time.Millisecond)
	if n := freed.Load(); n != 0 {
		t.Fatalf("freed %d times below the burst", n)
	}

	// Traffic that goes on puts the trim off; it comes once, after it.
	for i := 0; i < 6; i++ {
		tr.carried(500)
		time.Sleep(20 * time.Millisecond)
		if n := freed.Load(); n != 0 {
			t.Fatalf("freed during the traffic (call %d)", i)
		}
	}
	time.Sleep(700 * time.Millisecond)
	if n := freed.Load(); n != 1 {
		t.Fatalf("freed %d times after the burst, want 1", n)
	}

	// The count starts again: a small call after it frees nothing.
	tr.carried(10)
	time.Sleep(700 * time.Millisecond)
	if n := freed.Load(); n != 1 {
		t.Fatalf("freed %d times, want still 1", n)
	}
}
