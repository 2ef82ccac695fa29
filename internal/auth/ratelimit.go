package auth

import (
	"math"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
)

// Limiter bounds each token's requests by a token bucket: RatePerSec
// refills it, Burst is its size. A token without a rate is not bounded. The
// buckets are this process's: behind several control replicas a client may
// get up to the rate from each.
type Limiter struct {
	now func() time.Time

	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	tokens float64
	last   time.Time
}

// NewLimiter returns a limiter with empty history.
func NewLimiter() *Limiter {
	return &Limiter{now: time.Now, buckets: map[string]*bucket{}}
}

// Allow takes one request from tok's bucket, or refuses it with
// errdefs.ResourceExhausted and how long until one is available (the
// Retry-After the client gets, in whole seconds, at least 1).
func (l *Limiter) Allow(tok store.Token) (time.Duration, error) {
	if tok.RatePerSec <= 0 {
		return 0, nil
	}
	burst := float64(max(tok.Burst, 1))
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.buckets[tok.ID]
	if !ok {
		if len(l.buckets) > 100000 {
			clear(l.buckets) // a full map forgets history, never refuses
		}
		b = &bucket{tokens: burst, last: now}
		l.buckets[tok.ID] = b
	}
	b.tokens = math.Min(burst, b.tokens+now.Sub(b.last).Seconds()*tok.RatePerSec)
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return 0, nil
	}
	wait := time.Duration((1 - b.tokens) / tok.RatePerSec * float64(time.Second))
	secs := max(1, int(math.Ceil(wait.Seconds())))
	return time.Duration(secs) * time.Second, errdefs.New(errdefs.ResourceExhausted, "token %s is limited to %g requests/s (burst %d); retry after %d s", tok.ID, tok.RatePerSec, int(burst), secs).
		WithDetails(map[string]any{"rate_per_sec": tok.RatePerSec, "burst": int(burst), "retry_after_seconds": secs})
}
