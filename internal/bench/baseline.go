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
	bareDelete  bareKey = "delete"
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
	bareFork:   "save leaving the sandbox running, then restore a copy + first command (SPACE on gvisor makes the copy beside the save)",
	bareFrom:   "restore a copy of a save, which stays as it was + first command",
}

// countWriter counts what is written to it.
type countWriter struct{ n atomic.Int64 }

func (c *countWriter) Write(p []byte) (int, error) { c.n.Add(int64(len(p))); return len(p), nil }

// openBare makes the bare runtime with the template and resources of the
// SPACE sandbox id.
func (b *bench) openBare(ctx context.Context, runtime, id string) error {
	sb, err := b.c.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	bare, err := b.cfg.Baseline(ctx, runtime, BareSpec{TemplateDigest: sb.Template.Digest, Resources: sb.Resources})
	if err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	b.bare = bare
	return nil
}

func (b *bench) closeBare() {
	if b.bare != nil {
		b.bare.Close()
	}
}

// bareExec runs argv in the bare sandbox with its stdout copied to w and
// returns how long it took in ms; 0 without a bare sandbox or when it
// cannot run commands.
func (b *bench) bareExec(ctx context.Context, w io.Writer, argv ...string) (float64, error) {
	if b.bare == nil || b.bareNoEx {
		return 0, nil
	}
	start := time.Now()
	err := b.bare.Exec(ctx, w, argv...)
	if errors.Is(err, ErrNoBareExec) {
		b.bareNoEx = true
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("baseline: %v: %w", argv, err)
	}
	return msSince(start), nil
}

// timed runs one of the bare sandbox's steps and returns how long it took
// in ms.
func timed(ctx context.Context, what string, step func(context.Context) error) (float64, error) {
	start := time.Now()
	if err := step(ctx); err != nil {
		return 0, fmt.Errorf("baseline: %s: %w", what, err)
	}
	return msSince(start), nil
}

func msSince(start time.Time) float64 { return float64(time.Since(start).Microseconds()) / 1000 }

// compared fills row r's bare column and ratio from the bare samples taken
// beside its own (a row without them, in a run with a baseline, says it has
// no bare equivalent).
func (b *bench) compared(r Row, bare []float64) Row {
	if b.bare == nil {
		return r
	}
	if len(bare) == 0 {
		r.BareNote = "no bare equivalent"
		return r
	}
	r.Bare = pct(bare, .5)
	r.BareRaw = bare
	r.BareNote = bareNotes[bareKey(r.Key)]
	if n, ok := b.bare.(BareNoter); ok && n.Note(r.Key) != "" {
		r.BareNote = n.Note(r.Key)
	}
	if r.Bare > 0 {
		r.Ratio = r.P50 / r.Bare
	}
	return r
}

func ddArgv(n int64) []string {
	return []string{"sh", "-c", fmt.Sprintf("dd if=/dev/zero bs=1M count=%d 2>/dev/null", n>>20)}
}

func headArgv(n int64) []string { return []string{"head", "-c", fmt.Sprint(n), "/dev/zero"} }

func dirtyArgv(mib int) []string {
	return []string{"sh", "-c", fmt.Sprintf("head -c %d /dev/urandom > /tmp/space-bench-dirty", mib<<20)}
}
