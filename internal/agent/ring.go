package agent

import (
	"context"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/agent/proto"
)

// chunk is one read of a process's output.
type chunk struct {
	seq    uint64
	stream string
	data   []byte
}

// ring keeps a bounded window of a process's recent output. Chunks are
// numbered from 1. While a subscriber keeps reading, output it has not read
// is never evicted: the producer waits instead (so an attached client loses
// nothing); a subscriber that stops reading for subTTL no longer holds the
// producer back.
type ring struct {
	capBytes int
	subTTL   time.Duration

	mu     sync.Mutex // guards everything below
	chunks []chunk    // retained, ascending seq
	size   int
	next   uint64 // seq of the next chunk
	done   bool   // no more output will arrive
	notify chan struct{}
	subs   map[string]*subscriber
	// held is how long appends have waited for room in the window (summed
	// over the times at least one waited); appending counts those waiting
	// now, since heldFrom.
	held      time.Duration
	appending int
	heldFrom  time.Time
	// compacted: shrink has copied the chunks into buffers of their size.
	compacted bool
}

type subscriber struct {
	acked uint64 // every chunk ≤ acked has been delivered
	seen  time.Time
	// waiting counts reads of this subscriber blocked for output right
	// now: a reader waiting is there, however long ago it asked.
	waiting int
}

func newRing(capBytes int, subTTL time.Duration) *ring {
	return &ring{capBytes: capBytes, subTTL: subTTL, next: 1, notify: make(chan struct{}), subs: map[string]*subscriber{}}
}

// changedLocked wakes every waiter. Precondition: r.mu held.
func (r *ring) changedLocked() {
	close(r.notify)
	r.notify = make(chan struct{})
}

// neededLocked reports whether an active subscriber still needs seq.
// Precondition: r.mu held.
func (r *ring) neededLocked(seq uint64, now time.Time) bool {
	needed := false
	for id, s := range r.subs {
		if s.waiting == 0 && now.Sub(s.seen) > r.subTTL {
			delete(r.subs, id)
			continue
		}
		if s.acked < seq {
			needed = true
		}
	}
	return needed
}

// append adds a chunk (data is retained; the caller must not reuse it),
// evicting old output, or waiting while an active subscriber still needs it.
func (r *ring) append(stream string, data []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for r.size+len(data) > r.capBytes && len(r.chunks) > 0 {
		if !r.neededLocked(r.chunks[0].seq, time.Now()) {
			r.size -= len(r.chunks[0].data)
			r.chunks[0] = chunk{}
			r.chunks = r.chunks[1:]
			continue
		}
		if r.appending == 0 {
			r.heldFrom = time.Now()
		}
		r.appending++
		ch := r.notify
		r.mu.Unlock()
		select {
		case <-ch:
		case <-time.After(r.subTTL / 4):
		}
		r.mu.Lock()
		if r.appending--; r.appending == 0 {
			r.held += time.Since(r.heldFrom)
		}
	}
	r.chunks = append(r.chunks, chunk{seq: r.next, stream: stream, data: data})
	r.size += len(data)
	r.next++
	r.changedLocked()
}

// heldBack is how long appends have waited so far for a reader to make
// room in the window.
func (r *ring) heldBack() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.appending > 0 {
		return r.held + time.Since(r.heldFrom)
	}
	return r.held
}

// shrink, for the window of a process that has exited, evicts its oldest
// output no active reader still needs while what remains holds at least
// keep bytes (keep 0: all of it). The first shrink also copies what it keeps
// into buffers of its own size (a chunk may hold a read buffer up to twice
// its length). It returns the bytes the window holds after.
func (r *ring) shrink(keep int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	for len(r.chunks) > 0 && (keep == 0 || r.size-len(r.chunks[0].data) >= keep) && !r.neededLocked(r.chunks[0].seq, now) {
		r.size -= len(r.chunks[0].data)
		r.chunks[0] = chunk{}
		r.chunks = r.chunks[1:]
	}
	if !r.compacted {
		r.compacted = true
		kept := make([]chunk, len(r.chunks))
		for i, c := range r.chunks {
			c.data = append([]byte(nil), c.data...)
			kept[i] = c
		}
		r.chunks = kept
	}
	return r.size
}

// close records that no more output will arrive.
func (r *ring) close() {
	r.mu.Lock()
	r.done = true
	r.changedLocked()
	r.mu.Unlock()
}

// hold registers a reader that has read up to after: output it has not
// read is kept (the producer waits) until it reads or goes idle.
func (r *ring) hold(sub string, after uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.subs[sub]
	if s == nil {
		s = &subscriber{}
		r.subs[sub] = s
	}
	s.acked, s.seen = after, time.Now()
}

// read returns chunks after `after`, up to maxBytes (at least one chunk),
// waiting up to wait for some. exhausted is true when every chunk has been
// returned and no more will come.
func (r *ring) read(ctx context.Context, after uint64, maxBytes int, wait time.Duration, sub string) (resync bool, out []chunk, exhausted bool) {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		now := time.Now()
		if sub != "" {
			s := r.subs[sub]
			if s == nil {
				s = &subscriber{}
				r.subs[sub] = s
			}
			s.acked, s.seen = after, now
			r.changedLocked() // the producer may be waiting for this ack
		}
		first := r.next
		if len(r.chunks) > 0 {
			first = r.chunks[0].seq
		}
		// Output between after and the oldest retained chunk is gone, or the
		// client names a chunk that never existed.
		if after+1 < first || after >= r.next {
			if !(after == 0 && first == 1) && !(after == r.next-1) {
				resync = true
				after = first - 1
			}
		}
		n := 0
		for _, c := range r.chunks {
			if c.seq <= after {
				continue
			}
			if len(out) > 0 && n+len(c.data) > maxBytes {
				break
			}
			out = append(out, c)
			n += len(c.data)
		}
		if len(out) > 0 || resync {
			// A window emptied after its process exited (shrink) has
			// nothing to follow the resync with: the end comes with it.
			return resync, out, resync && len(out) == 0 && r.done
		}
		if r.done {
			return false, nil, true
		}
		ch := r.notify
		s := r.subs[sub]
		if s != nil {
			s.waiting++
		}
		r.mu.Unlock()
		timedOut := false
		select {
		case <-ch:
		case <-deadline.C:
			timedOut = true
		case <-ctx.Done():
			timedOut = true
		}
		r.mu.Lock()
		if s != nil {
			s.waiting--
			s.seen = time.Now()
		}
		if timedOut {
			return false, nil, false
		}
	}
}

// toResult packs chunks into a read result and its blob.
func toResult(resync bool, cs []chunk) (proto.ReadResult, []byte) {
	res := proto.ReadResult{Resync: resync, Chunks: make([]proto.Chunk, 0, len(cs))}
	size := 0
	for _, c := range cs {
		res.Chunks = append(res.Chunks, proto.Chunk{Seq: c.seq, Stream: c.stream, Len: len(c.data)})
		size += len(c.data)
	}
	if len(cs) == 1 {
		// A chunk is never written to once in the ring: send it as it is
		// (streaming output is one large chunk per read) instead of a copy.
		return res, cs[0].data
	}
	blob := make([]byte, 0, size)
	for _, c := range cs {
		blob = append(blob, c.data...)
	}
	return res, blob
}
