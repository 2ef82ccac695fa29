package commands

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"math"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandboxio"
)

// Event is one step of a followed process: a chunk of output, a resync
// notice, the process's exit, or a quiet spell (nothing came in the wait).
type Event struct {
	// Chunk: Seq, Stream (sandboxio.Stdout, sandboxio.Stderr) and Data.
	// Data is valid until emit returns: its buffer is reused after.
	Seq    uint64
	Stream string
	Data   []byte
	// Flush marks the last event of what the agent had ready: a good point
	// to flush buffered writes.
	Flush bool
	// Resync: output after the requested point is no longer retained; what
	// follows is the retained output, which starts after ResumeAt.
	Resync   bool
	ResumeAt uint64
	// Exited: the process is gone and every chunk was delivered.
	Exited *sandboxio.Process
	// Quiet: nothing happened during the wait; a keepalive is due.
	Quiet bool
	// Started: Follow started the process (start=true); its status.
	Started *sandboxio.Process
}

// holdEvery is how often a reader busy with a slow client tells the agent
// it is still there (the agent forgets a reader after 5 s).
const holdEvery = time.Second

// FollowAll, as the after of Follow, asks for no chunk: the agent answers
// with a resync and the retained output.
const FollowAll = math.MaxUint64

// Follow streams a started process's output after chunk `after` to emit
// (an event's Data is the caller's only until emit returns), waiting up to
// wait for each step, until the process has exited (the last event has
// Exited set; Follow then returns nil). The agent's window never
// evicts output this reader has not read. When the sandbox stops running
// (pause, suspend, delete) Follow returns an error: the stream is
// incomplete and the caller resumes later from the last Seq it saw. Follow
// keeps the sandbox awake while it runs.
//
// With start, Follow starts the (pending) process once its reader is
// registered, so not a byte of its output can be evicted before it is read,
// and emits a Started event first.
func (s *Service) Follow(ctx context.Context, sandboxID, processID string, after uint64, wait time.Duration, start bool, emit func(Event) error) error {
	ag, _, err := s.cfg.Agents.Agent(ctx, sandboxID)
	if err != nil {
		return err
	}
	release := s.cfg.Agents.Attached(sandboxID)
	defer release()
	sub := newSubscriber()
	if start {
		// The agent registers this reader before it starts the process.
		p, err := ag.StartProcess(ctx, processID, sub, min(after, FollowAll-1))
		if err != nil {
			return err
		}
		if err := emit(Event{Started: &p}); err != nil {
			return err
		}
	}
	// One batch is read ahead while the previous one is emitted, so the
	// agent's round trip overlaps the encoding and writing of output.
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type batch struct {
		out   sandboxio.Output
		after uint64 // what the read asked for
		err   error
	}
	batches := make(chan batch, 1)
	go func() {
		defer close(batches)
		for {
			asked := after
			out, err := ag.ReadOutput(rctx, processID, asked, 1<<20, wait, sub)
			if err != nil {
				if !sandboxio.Refused(err) && rctx.Err() == nil {
					// The agent went away (paused, suspended, restored,
					// deleted). Reach it again while the sandbox runs;
					// otherwise the stream is incomplete.
					if ag, err = s.reacquire(rctx, sandboxID); err == nil {
						continue
					}
				}
				select {
				case batches <- batch{err: err}:
				case <-rctx.Done():
				}
				return
			}
			if n := len(out.Chunks); n > 0 {
				after = out.Chunks[n-1].Seq
			}
			// While the batch waits for a slow client, keep this reader's
			// place in the agent's window (it idles out after seconds):
			// the process waits rather than lose output (an agent from
			// before process.hold answers an error: stop asking).
			hold := time.NewTicker(holdEvery)
		send:
			for {
				select {
				case batches <- batch{out: out, after: asked}:
					break send
				case <-hold.C:
					if err := ag.Hold(rctx, processID, sub, asked); err != nil {
						hold.Stop()
					}
				case <-rctx.Done():
					hold.Stop()
					return
				}
			}
			hold.Stop()
			if out.Exited != nil {
				return
			}
		}
	}()
	for {
		b, ok := <-batches
		if !ok {
			return ctx.Err()
		}
		if b.err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return b.err
		}
		out := b.out
		if out.Resync {
			ev := Event{Resync: true, ResumeAt: b.after, Flush: len(out.Chunks) == 0}
			if len(out.Chunks) > 0 {
				ev.ResumeAt = out.Chunks[0].Seq - 1
			}
			if err := emit(ev); err != nil {
				return err
			}
		}
		off := 0
		for i, c := range out.Chunks {
			last := i == len(out.Chunks)-1 && out.Exited == nil
			if err := emit(Event{Seq: c.Seq, Stream: c.Stream, Data: out.Data[off : off+c.Len], Flush: last}); err != nil {
				return err
			}
			off += c.Len
		}
		out.Release() // every chunk is written: the next read may reuse the buffer
		if out.Exited != nil {
			return emit(Event{Exited: out.Exited})
		}
		if len(out.Chunks) == 0 && !out.Resync {
			if err := emit(Event{Quiet: true}); err != nil {
				return err
			}
		}
	}
}

// reacquire waits briefly for a running sandbox's agent to answer again.
func (s *Service) reacquire(ctx context.Context, sandboxID string) (*sandboxio.Agent, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		ag, _, err := s.cfg.Agents.Agent(ctx, sandboxID)
		if err == nil {
			return ag, nil
		}
		if errors.Is(err, errdefs.FailedPrecondition) || errors.Is(err, errdefs.NotFound) || time.Now().After(deadline) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func newSubscriber() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
