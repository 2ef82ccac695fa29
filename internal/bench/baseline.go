package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/spacesandbox/space/client"
)

// Bare is the runtime doing a row's work by itself on the same host, with
// the configuration SPACE gives it but none of SPACE (no API, store,
// operations, agent): the floor each row is compared with. One sandbox at
// a time; the runtimes implement it (gvisor.Bare: runsc; vm.Bare: QEMU and
// QMP).
type Bare interface {
	// Create starts the sandbox and waits until it can run a command.
	Create(ctx context.Context) error
	// Exec runs argv to completion with its stdout copied to w;
	// ErrNoBareExec when the runtime has no way to run a command.
	Exec(ctx context.Context, w io.Writer, argv ...string) error
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
	// Suspend saves the sandbox (memory, devices, disk) and ends it; Wake
	// restores that save until it can run a command.
	Suspend(ctx context.Context) error
	Wake(ctx context.Context) error
	// Fork saves the running sandbox, lets it run on, and starts a copy
	// from the save until the copy can run a command; the copy is gone
	// when Fork returns.
	Fork(ctx context.Context) error
	// FromSave starts a second sandbox from the last Suspend's save,
	// leaving the save as it was for the next start (as a snapshot must
	// be), until the copy can run a command; the copy is gone when it
	// returns.
	FromSave(ctx context.Context) error
	Delete(ctx context.Context) error
	Close() error
}

// BareNoter is a Bare whose rows measure something other than bareNotes
// says (a VMM runs commands through the guest's agent, and boots cold):
// Note returns what the row named key measured, or "" for the default.
type BareNoter interface {
	Note(key string) string
}

// BareSpec is what the bare sandbox must match: the SPACE sandbox's
// template (by digest) and resources.
type BareSpec struct {
	TemplateDigest string
	Resources      client.Resources
}

// ErrNoBareExec: the bare runtime cannot run a command (a VMM has no exec).
var ErrNoBareExec = errors.New("the bare runtime has no exec")

// bareKey names the bare measurement a row is compared with.
type bareKey string

const (
	bareCreate  bareKey = "create"
	bareExec    bareKey = "exec"
	bareDD      bareKey = "stdout_dd"
	bareHead    bareKey = "stdout_head"
	barePause   bareKey = "pause"
	bareResume  bareKey = "resume"
	bareSuspend bareKey = "suspend"
	bareWake    bareKey = "wake"
	bareFork    bareKey = "fork"
	bareFrom    bareKey = "from_save"
)

// bareNotes says what a row's bare column measured, where it is not the
// row's own work done by the runtime alone.
var bareNotes = map[bareKey]string{
	bareCreate: "cold start + first command (SPACE may serve it from a warm pool: then compared with the cold bare path)",
	bareDD:     "the command's stdout on a host pipe",
	bareHead:   "the command's stdout on a host pipe",
	bareWake:   "restore + first command",
	bareFork:   "save leaving the sandbox running + restore a copy + first command",
	bareFrom:   "restore a copy of a save, which stays as it was + first command",
}

// countWriter counts what is written to it.
type countWriter struct{ n atomic.Int64 }

func (c *countWriter) Write(p []byte) (int, error) { c.n.Add(int64(len(p))); return len(p), nil }

// bareRows measures every bare row: latency rows in ms, streaming rows in
// MiB/s. A row the runtime cannot do is left out.
func (b *bench) bareRows(ctx context.Context, bare Bare) (map[bareKey][]float64, error) {
	say := func(format string, a ...any) { b.say("baseline: "+format, a...) }
	rows := map[bareKey][]float64{}
	ms := func(k bareKey, start time.Time) {
		rows[k] = append(rows[k], float64(time.Since(start).Microseconds())/1000)
	}
	say("create, %d runs", b.cfg.Runs)
	for i := 0; i < b.cfg.Runs; i++ {
		start := time.Now()
		if err := bare.Create(ctx); err != nil {
			return nil, fmt.Errorf("bare create: %w", err)
		}
		ms(bareCreate, start)
		if i < b.cfg.Runs-1 {
			if err := bare.Delete(ctx); err != nil {
				return nil, fmt.Errorf("bare delete: %w", err)
			}
		}
	}
	hasExec := true
	say("exec round trip, %d runs", b.cfg.Runs)
	for i := 0; i < b.cfg.Runs; i++ {
		start := time.Now()
		err := bare.Exec(ctx, io.Discard, "true")
		if errors.Is(err, ErrNoBareExec) {
			hasExec = false
			break
		}
		if err != nil {
			return nil, err
		}
		ms(bareExec, start)
	}
	if hasExec {
		for _, s := range []struct {
			k    bareKey
			argv []string
		}{
			{bareDD, ddArgv(b.cfg.StreamBytes)},
			{bareHead, headArgv(b.cfg.StreamBytes)},
		} {
			say("stdout %s, %d runs", s.argv, streamRuns(b.cfg.Runs))
			for range streamRuns(b.cfg.Runs) {
				var w countWriter
				start := time.Now()
				if err := bare.Exec(ctx, &w, s.argv...); err != nil {
					return nil, err
				}
				if w.n.Load() != b.cfg.StreamBytes {
					return nil, fmt.Errorf("bare %v: %d bytes, want %d", s.argv, w.n.Load(), b.cfg.StreamBytes)
				}
				rows[s.k] = append(rows[s.k], float64(b.cfg.StreamBytes)/(1<<20)/time.Since(start).Seconds())
			}
		}
	}
	say("pause/resume, %d runs", b.cfg.Runs)
	for i := 0; i < b.cfg.Runs; i++ {
		start := time.Now()
		if err := bare.Pause(ctx); err != nil {
			return nil, err
		}
		ms(barePause, start)
		start = time.Now()
		if err := bare.Resume(ctx); err != nil {
			return nil, err
		}
		ms(bareResume, start)
	}
	runs := max(1, b.cfg.Runs/2)
	say("suspend/wake with %d MiB dirty, %d runs", b.cfg.DirtyMiB, runs)
	for i := 0; i < runs; i++ {
		if hasExec {
			if err := bare.Exec(ctx, io.Discard, dirtyArgv(b.cfg.DirtyMiB)...); err != nil {
				return nil, err
			}
		}
		start := time.Now()
		if err := bare.Suspend(ctx); err != nil {
			return nil, fmt.Errorf("bare suspend: %w", err)
		}
		ms(bareSuspend, start)
		start = time.Now()
		if err := bare.Wake(ctx); err != nil {
			return nil, fmt.Errorf("bare wake: %w", err)
		}
		ms(bareWake, start)
	}
	// As SPACE's row does: one save, then starts from it (the first reads
	// an image just written, the rest find it cached).
	say("start from a save, %d runs", runs)
	if err := bare.Suspend(ctx); err != nil {
		return nil, fmt.Errorf("bare suspend: %w", err)
	}
	for i := 0; i < runs; i++ {
		start := time.Now()
		if err := bare.FromSave(ctx); err != nil {
			return nil, fmt.Errorf("bare start from a save: %w", err)
		}
		ms(bareFrom, start)
	}
	if err := bare.Wake(ctx); err != nil {
		return nil, fmt.Errorf("bare wake: %w", err)
	}
	say("fork, %d runs", runs)
	for i := 0; i < runs; i++ {
		if hasExec { // as SPACE's row does
			if err := bare.Exec(ctx, io.Discard, dirtyArgv(b.cfg.DirtyMiB)...); err != nil {
				return nil, err
			}
		}
		start := time.Now()
		if err := bare.Fork(ctx); err != nil {
			return nil, fmt.Errorf("bare fork: %w", err)
		}
		ms(bareFork, start)
	}
	return rows, bare.Delete(ctx)
}

// withBaseline fills each row's bare column and ratio from the bare rows
// that b measured.
func withBaseline(rep *Report, bare map[bareKey][]float64, b Bare) {
	for i := range rep.Rows {
		r := &rep.Rows[i]
		xs, ok := bare[bareKey(r.Key)]
		if !ok || len(xs) == 0 {
			if r.Key != "" {
				r.BareNote = "no bare equivalent"
			}
			continue
		}
		r.Bare = pct(xs, .5)
		r.BareRaw = xs
		r.BareNote = bareNotes[bareKey(r.Key)]
		if n, ok := b.(BareNoter); ok && n.Note(r.Key) != "" {
			r.BareNote = n.Note(r.Key)
		}
		if r.Bare > 0 {
			r.Ratio = r.P50 / r.Bare
		}
	}
}

func ddArgv(n int64) []string {
	return []string{"sh", "-c", fmt.Sprintf("dd if=/dev/zero bs=1M count=%d 2>/dev/null", n>>20)}
}

func headArgv(n int64) []string { return []string{"head", "-c", fmt.Sprint(n), "/dev/zero"} }

func dirtyArgv(mib int) []string {
	return []string{"sh", "-c", fmt.Sprintf("head -c %d /dev/urandom > /tmp/space-bench-dirty", mib<<20)}
}
