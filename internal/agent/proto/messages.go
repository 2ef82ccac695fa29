package proto

import "time"

// Methods the agent serves. Params and results are the structs below.
const (
	MethodInfo       = "agent.info"      // → Info
	MethodConfigure  = "agent.configure" // Configure (+ blob: entropy) → Info
	MethodSync       = "agent.sync"      // flush filesystems → {}
	MethodProcCreate = "process.create"  // ProcessSpec → Process (state pending)
	MethodProcStart  = "process.start"   // ProcessRef → Process
	MethodProcGet    = "process.get"     // ProcessRef → Process
	MethodProcList   = "process.list"    // {} → ProcessList (running)
	MethodProcRead   = "process.read"    // ReadRequest → ReadResult (+ blob)
	MethodProcSignal = "process.signal"  // SignalRequest → {}
	MethodProcStdin  = "process.stdin"   // ProcessRef (+ blob) → {}
	MethodProcClose  = "process.close_stdin"
	MethodProcResize = "process.resize" // ResizeRequest → {}
	MethodProcHold   = "process.hold"   // HoldRequest → {}

	MethodFileStat        = "file.stat"         // PathRequest → Entry
	MethodFileList        = "file.list"         // ListRequest → EntryList
	MethodFileRead        = "file.read"         // ReadFileRequest → ReadFileResult (+ blob)
	MethodFileWriteBegin  = "file.write_begin"  // WriteBegin → WriteHandle
	MethodFileWriteChunk  = "file.write_chunk"  // WriteChunk (+ blob) → {}
	MethodFileWriteCommit = "file.write_commit" // WriteHandle → Entry
	MethodFileWriteAbort  = "file.write_abort"  // WriteHandle → {}
	MethodFileRemove      = "file.remove"       // RemoveRequest → {}
	MethodFileMkdir       = "file.mkdir"        // MkdirRequest → Entry
	MethodFileMove        = "file.move"         // MoveRequest → Entry
)

// Info describes the agent and its sandbox.
type Info struct {
	Agent    string    `json:"agent"`
	Version  int       `json:"version"`
	Hostname string    `json:"hostname"`
	PID      int       `json:"pid"`
	Init     bool      `json:"init"` // running as PID 1
	Now      time.Time `json:"now"`
	BootID   string    `json:"boot_id,omitempty"`
}

// Configure sets the sandbox's identity after create, wake or fork. Zero
// fields are left alone. The call's blob, when present, is mixed into the
// kernel's entropy pool.
type Configure struct {
	Hostname string `json:"hostname,omitempty"`
	// UnixNano sets the wall clock when non-zero.
	UnixNano int64 `json:"unix_nano,omitempty"`
	// Network configures the sandbox's network when present.
	Network *NetConfig `json:"network,omitempty"`
}

// NetConfig is a sandbox's network as the agent sets it up: lo up, the
// first other interface with Address (CIDR) and a default route via
// Gateway (unless the runtime configured it already, as gVisor does), and
// /etc/resolv.conf naming DNS.
type NetConfig struct {
	Address string `json:"address"`
	Gateway string `json:"gateway"`
	DNS     string `json:"dns"`
}

// PTY asks for a pseudo-terminal of the given size.
type PTY struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

// ProcessSpec describes a process to run. It does not start until
// process.start.
type ProcessSpec struct {
	ID      string            `json:"id"`
	Argv    []string          `json:"argv"`
	Env     map[string]string `json:"env,omitempty"`
	Cwd     string            `json:"cwd,omitempty"`
	Timeout time.Duration     `json:"timeout,omitempty"` // 0: none
	Stdin   bool              `json:"stdin,omitempty"`
	PTY     *PTY              `json:"pty,omitempty"`
	// Tag is opaque to the agent (the host stores the session's owner).
	Tag string `json:"tag,omitempty"`
	// User runs the process as this user of the sandbox (name or uid; ""
	// is the agent's own user, root): its uid, gid and groups, with HOME,
	// USER and LOGNAME set and, without Cwd, its home as working directory.
	User string `json:"user,omitempty"`
}

// ProcessRef names a process.
type ProcessRef struct {
	ID string `json:"id"`
}

// HoldRequest tells a process's output window that Subscriber is still
// reading (it has read up to After) though it asks for nothing now: a host
// busy writing to a slow client keeps its place, so the process waits
// instead of output being evicted.
type HoldRequest struct {
	ID         string `json:"id"`
	Subscriber string `json:"subscriber"`
	After      uint64 `json:"after"`
}

// StartRequest starts a pending process. With Subscriber, that reader is
// registered with the process's output window first (as having read up to
// After), so none of the output is evicted before it reads.
type StartRequest struct {
	ID         string `json:"id"`
	Subscriber string `json:"subscriber,omitempty"`
	After      uint64 `json:"after,omitempty"`
}

// Process states.
const (
	ProcPending = "pending"
	ProcRunning = "running"
	ProcExited  = "exited"
)

// Process is a process's current status.
type Process struct {
	ID        string            `json:"id"`
	State     string            `json:"state"`
	Argv      []string          `json:"argv"`
	Cwd       string            `json:"cwd,omitempty"`
	Env       map[string]string `json:"-"`
	PID       int               `json:"pid,omitempty"`
	PTY       bool              `json:"pty"`
	Tag       string            `json:"tag,omitempty"`
	User      string            `json:"user,omitempty"`
	ExitCode  *int              `json:"exit_code,omitempty"`
	Signal    string            `json:"signal,omitempty"`
	Error     *Error            `json:"error,omitempty"` // why it failed (timeout, missing executable, …)
	CreatedAt time.Time         `json:"created_at"`
	StartedAt *time.Time        `json:"started_at,omitempty"`
	ExitedAt  *time.Time        `json:"exited_at,omitempty"`
}

// ProcessList lists processes.
type ProcessList struct {
	Items []Process `json:"items"`
}

// ReadRequest asks for output after chunk After (0 = from the start).
type ReadRequest struct {
	ID    string `json:"id"`
	After uint64 `json:"after"`
	// MaxBytes bounds the blob (at most MaxBlob).
	MaxBytes int `json:"max_bytes"`
	// Wait is how long to wait for output when none is ready.
	Wait time.Duration `json:"wait"`
	// Subscriber identifies one reader; while it keeps reading, output it
	// has not read is never evicted (the process waits instead).
	Subscriber string `json:"subscriber,omitempty"`
}

// Stream names.
const (
	Stdout = "stdout"
	Stderr = "stderr"
)

// Chunk describes one output chunk inside a ReadResult's blob.
type Chunk struct {
	Seq    uint64 `json:"seq"`
	Stream string `json:"stream"`
	Len    int    `json:"len"`
}

// ReadResult is output after a point; the chunks' bytes are the blob, in
// order.
type ReadResult struct {
	// Resync is true when output after the requested point was evicted:
	// Chunks then start at the oldest retained chunk.
	Resync bool    `json:"resync,omitempty"`
	Chunks []Chunk `json:"chunks"`
	// Exited is set once every chunk has been read and the process is gone.
	Exited *Process `json:"exited,omitempty"`
}

// SignalRequest sends a signal to a process's group.
type SignalRequest struct {
	ID     string `json:"id"`
	Signal string `json:"signal"` // "SIGTERM", "SIGKILL", …
}

// ResizeRequest changes a PTY's size.
type ResizeRequest struct {
	ID   string `json:"id"`
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

// Entry is a file system entry.
type Entry struct {
	Path    string    `json:"path"`
	Name    string    `json:"name"`
	Type    string    `json:"type"` // file, dir, symlink, other
	Size    int64     `json:"size"`
	Mode    string    `json:"mode"` // octal permission bits, e.g. "0644"
	ModTime time.Time `json:"mtime"`
	Target  string    `json:"symlink_target,omitempty"`
	// Resolved is a symlink's target with every link followed, absolute
	// in the sandbox; TargetType and TargetMode describe what is there
	// ("" when the link dangles or loops).
	Resolved   string `json:"resolved,omitempty"`
	TargetType string `json:"target_type,omitempty"`
	TargetMode string `json:"target_mode,omitempty"`
	UID        int    `json:"uid"`
	GID        int    `json:"gid"`
	Owner      string `json:"owner,omitempty"` // user name of UID in the sandbox
	Group      string `json:"group,omitempty"` // group name of GID in the sandbox
}

// EntryList lists entries.
type EntryList struct {
	Items []Entry `json:"items"`
	// Truncated is true when the listing hit its entry limit.
	Truncated bool `json:"truncated,omitempty"`
}

// PathRequest names a path.
type PathRequest struct {
	Path string `json:"path"`
}

// ListRequest lists a directory to a depth (1 = its children).
type ListRequest struct {
	Path  string `json:"path"`
	Depth int    `json:"depth"`
}

// ReadFileRequest reads part of a file.
type ReadFileRequest struct {
	Path   string `json:"path"`
	Offset int64  `json:"offset"`
	Length int    `json:"length"`
}

// ReadFileResult accompanies a blob of file contents.
type ReadFileResult struct {
	Size int64 `json:"size"`
	EOF  bool  `json:"eof"`
}

// WriteBegin starts writing a file (atomically replaced on commit).
type WriteBegin struct {
	Path string `json:"path"`
	Mode uint32 `json:"mode"` // permission bits; 0 means 0644
	// User owns the file and the directories the write creates (name or
	// uid; "" leaves them to the agent's user).
	User string `json:"user,omitempty"`
}

// WriteHandle names a write in progress.
type WriteHandle struct {
	Handle string `json:"handle"`
}

// WriteChunk appends the blob to a write in progress at Offset.
type WriteChunk struct {
	Handle string `json:"handle"`
	Offset int64  `json:"offset"`
}

// RemoveRequest removes a path.
type RemoveRequest struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive"`
}

// MkdirRequest makes a directory (and its parents).
type MkdirRequest struct {
	Path string `json:"path"`
	Mode uint32 `json:"mode"`           // 0 means 0755
	User string `json:"user,omitempty"` // owns the directories made (see WriteBegin)
}

// MoveRequest renames a path.
type MoveRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// Empty is the result of calls that return nothing.
type Empty struct{}
