package sandboxio

import (
	"context"
	"time"

	"github.com/spacesandbox/space/internal/agent/proto"
)

// The streams a process writes.
const (
	Stdout = proto.Stdout
	Stderr = proto.Stderr
)

// ProcPending is the state of a process registered but not started (it
// starts on first attach); the others are "running" and "exited".
const ProcPending = proto.ProcPending

// Process is a process's status in the sandbox.
type Process struct {
	ID       string
	State    string // ProcPending, "running" or "exited"
	Argv     []string
	Cwd      string
	PID      int
	PTY      bool
	Tag      string
	User     string
	ExitCode *int
	Signal   string
	// ErrorCode and ErrorMessage say why it failed (timeout, missing
	// executable, …); "" when it did not.
	ErrorCode, ErrorMessage string
	CreatedAt               time.Time
	StartedAt, ExitedAt     *time.Time
}

func process(p proto.Process) Process {
	out := Process{ID: p.ID, State: p.State, Argv: p.Argv, Cwd: p.Cwd, PID: p.PID, PTY: p.PTY, Tag: p.Tag, User: p.User,
		ExitCode: p.ExitCode, Signal: p.Signal, CreatedAt: p.CreatedAt, StartedAt: p.StartedAt, ExitedAt: p.ExitedAt}
	if p.Error != nil {
		out.ErrorCode, out.ErrorMessage = p.Error.Code, p.Error.Message
	}
	return out
}

// Spec is a process to register; it does not run until Start.
type Spec struct {
	ID      string
	Argv    []string
	Env     map[string]string
	Cwd     string
	Timeout time.Duration // 0: none
	Stdin   bool
	// PTYCols and PTYRows ask for a terminal of that size (0: pipes).
	PTYCols, PTYRows uint16
	Tag              string // opaque to the agent
	// User runs it as this user of the sandbox (name or uid; "": root).
	User string
}

// CreateProcess registers a process.
func (a *Agent) CreateProcess(ctx context.Context, s Spec) (Process, error) {
	ps := proto.ProcessSpec{ID: s.ID, Argv: s.Argv, Env: s.Env, Cwd: s.Cwd, Timeout: s.Timeout, Stdin: s.Stdin, Tag: s.Tag, User: s.User}
	if s.PTYCols > 0 || s.PTYRows > 0 {
		ps.PTY = &proto.PTY{Cols: s.PTYCols, Rows: s.PTYRows}
	}
	p, err := a.c.CreateProcess(ctx, ps)
	return process(p), a.fail("create process", err)
}

// StartProcess starts a registered process with subscriber already reading
// after chunk `after`, so none of its output is evicted before it is read.
func (a *Agent) StartProcess(ctx context.Context, id, subscriber string, after uint64) (Process, error) {
	p, err := a.c.StartProcessFor(ctx, proto.StartRequest{ID: id, Subscriber: subscriber, After: after})
	return process(p), a.fail("start process", err)
}

// GetProcess returns one process.
func (a *Agent) GetProcess(ctx context.Context, id string) (Process, error) {
	p, err := a.c.GetProcess(ctx, id)
	return process(p), a.fail("get process", err)
}

// Processes lists every process the agent knows.
func (a *Agent) Processes(ctx context.Context) ([]Process, error) {
	ps, err := a.c.ListProcesses(ctx)
	if err != nil {
		return nil, a.fail("list processes", err)
	}
	out := make([]Process, 0, len(ps))
	for _, p := range ps {
		out = append(out, process(p))
	}
	return out, nil
}

// Chunk is one piece of output: its sequence number, stream and length in
// Output.Data.
type Chunk struct {
	Seq    uint64
	Stream string
	Len    int
}

// Output is one read of a process's output.
type Output struct {
	// Resync: output after the requested point was evicted; Chunks start
	// at the oldest retained one.
	Resync bool
	Chunks []Chunk
	Data   []byte // the chunks' bytes, in order
	// Exited is set once the process exited and every chunk was read.
	Exited *Process

	release func()
}

// Release hands Data's buffer back for a later read: Data must not be used
// after. Optional (an output never released is collected), at most once.
func (o *Output) Release() {
	if o.release != nil {
		o.release()
		o.release = nil
	}
}

// ReadOutput reads output after chunk `after` for subscriber, waiting up to
// wait for some.
func (a *Agent) ReadOutput(ctx context.Context, id string, after uint64, maxBytes int, wait time.Duration, subscriber string) (Output, error) {
	o, err := a.c.ReadOutput(ctx, id, after, maxBytes, wait, subscriber)
	if err != nil {
		return Output{}, a.fail("read output", err)
	}
	out := Output{Resync: o.Resync, Data: o.Data, Chunks: make([]Chunk, len(o.Chunks)), release: o.Release}
	for i, c := range o.Chunks {
		out.Chunks[i] = Chunk(c)
	}
	if o.Exited != nil {
		p := process(*o.Exited)
		out.Exited = &p
	}
	return out, nil
}

// Hold keeps subscriber's place (it has read up to after) in a process's
// output window while it reads nothing.
func (a *Agent) Hold(ctx context.Context, id, subscriber string, after uint64) error {
	return a.fail("hold output", a.c.Hold(ctx, id, subscriber, after))
}

// Signal signals a process's group.
func (a *Agent) Signal(ctx context.Context, id, sig string) error {
	return a.fail("signal", a.c.Signal(ctx, id, sig))
}

// Stdin writes data to a process's stdin, a chunk per agent call (one call
// for no data).
func (a *Agent) Stdin(ctx context.Context, id string, data []byte) error {
	for off := 0; ; {
		end := min(off+chunk, len(data))
		if err := a.c.Stdin(ctx, id, data[off:end]); err != nil {
			return a.fail("stdin", err)
		}
		if off = end; off == len(data) {
			return nil
		}
	}
}

// CloseStdin closes a process's stdin.
func (a *Agent) CloseStdin(ctx context.Context, id string) error {
	return a.fail("close stdin", a.c.CloseStdin(ctx, id))
}

// Resize resizes a process's terminal.
func (a *Agent) Resize(ctx context.Context, id string, cols, rows uint16) error {
	return a.fail("resize", a.c.Resize(ctx, id, cols, rows))
}
