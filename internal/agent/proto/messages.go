package proto

import "time"

// Methods the agent serves. Params and results are the structs below.
const (
	MethodInfo       = "agent.info"      // → Info
	MethodConfigure  = "agent.configure" // Configure (+ blob: entropy) → Info
	MethodSync       = "agent.sync"      // flush filesystems → {}
	MethodMetrics    = "agent.metrics"   // {} → Metrics
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

	MethodWatchStart = "watch.start" // WatchRequest → WatchHandle
	MethodWatchRead  = "watch.read"  // WatchRead → WatchEvents
	MethodWatchStop  = "watch.stop"  // WatchHandle → {}
)

// WatchRequest watches a directory (with Recursive, its whole tree) for
// changes; the agent keeps the events until they are read (see WatchRead).
type WatchRequest struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive,omitempty"`
}

// WatchHandle names a watch.
type WatchHandle struct {
	ID string `json:"id"`
}

// WatchRead reads a watch's events after the sequence number After,
// waiting up to Wait for one when none is there.
type WatchRead struct {
	ID    string        `json:"id"`
	After uint64        `json:"after"`
	Wait  time.Duration `json:"wait,omitempty"`
}

// Operations of a watch event.
const (
	WatchCreate = "create"
	WatchWrite  = "write"
	WatchRemove = "remove"
	WatchRename = "rename" // moved away (its new name, if watched, is a create)
	WatchChmod  = "chmod"  // permissions, owner or other attributes
)

// WatchEvent is one change, Name relative to the watched directory.
type WatchEvent struct {
	Seq  uint64 `json:"seq"`
	Name string `json:"name"`
	Op   string `json:"op"`
	Dir  bool   `json:"dir,omitempty"`
}

// WatchEvents is what a read returns. Lost says events after After were
// dropped (the agent's buffer or the kernel's queue overflowed); Closed that
// the watched directory is gone and no more events will come.
type WatchEvents struct {
	Events []WatchEvent `json:"events"`
	Lost   bool         `json:"lost,omitempty"`
	Closed bool         `json:"closed,omitempty"`
}

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

// Metrics is the sandbox's use of CPU, memory and disk as it sees them
// (what E2B's envd reports): memory and disk in bytes, of the root file
// system for disk.
type Metrics struct {
	CPUCount int `json:"cpu_count"`
	// CPUUsedPct is the busy share of all CPUs since the previous call (since
	// boot on the first), 0–100.
	CPUUsedPct float64 `json:"cpu_used_pct"`
	MemTotal   uint64  `json:"mem_total"`
	MemUsed    uint64  `json:"mem_used"` // total - free - buffers - page cache
	MemCache   uint64  `json:"mem_cache"`
	DiskTotal  uint64  `json:"disk_total"`
	DiskUsed   uint64  `json:"disk_used"`
	// AgentRSS is the agent's own resident memory (part of MemUsed); 0
	// from an agent too old to say.
	AgentRSS uint64 `json:"agent_rss"`
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
	// CPUs is the sandbox's vCPUs: the processes the agent starts from then
	// on may run on that many of the CPUs the kernel shows (their
	// affinity), when it shows more. 0: unchanged.
	CPUs int `json:"cpus,omitempty"`
}

// NetConfig is a sandbox's network as the agent sets it up: lo up, the
// first other interface with Address (CIDR) and a default route via
// Gateway (unless the runtime configured it already, as gVisor does), and
// /etc/resolv.conf naming DNS.
type NetConfig struct {
	Address string `json:"address"`
	Gateway string `json:"gateway"`
	DNS     string `json:"dns"`
	// Given says the runtime gave the link Address and the default route
	// when it booted the sandbox (gVisor takes them from its namespace),
	// so only the resolver is left to set: no look at the links. An agent
	// from before it looks anyway.
	Given bool `json:"given,omitempty"`
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
	// Metadata is a file's or directory's user-defined metadata (see
	// WriteBegin.Metadata); values that are not UTF-8 are left out.
	Metadata map[string]string `json:"metadata,omitempty"`
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
	// Metadata becomes the file's user-defined metadata: one extended
	// attribute user.e2b.<key> each (E2B's envd keeps it the same way).
	// Keys and values are printable ASCII; see MaxMetadata*.
	Metadata map[string]string `json:"metadata,omitempty"`
}

// Limits of a file's metadata: a key is at most what an xattr name may hold
// after the prefix, and all of a file's metadata (names with their prefix,
// and values) fits the block ext4 keeps an inode's attributes in.
const (
	MetadataPrefix      = "user.e2b."
	MaxMetadataKeyLen   = 255 - len(MetadataPrefix)
	MaxMetadataTotalLen = 4096
)

// ValidateMetadata says why m cannot be a file's metadata, or nil.
func ValidateMetadata(m map[string]string) error {
	total := 0
	for k, v := range m {
		switch {
		case k == "":
			return Errorf(CodeInvalidArgument, "a metadata key is empty")
		case len(k) > MaxMetadataKeyLen:
			return Errorf(CodeInvalidArgument, "metadata key %.40q… is longer than %d bytes", k, MaxMetadataKeyLen)
		case !printable(k):
			return Errorf(CodeInvalidArgument, "metadata key %q is not printable ASCII", k)
		case !printable(v):
			return Errorf(CodeInvalidArgument, "the value of metadata key %q is not printable ASCII", k)
		}
		total += len(MetadataPrefix) + len(k) + len(v)
	}
	if total > MaxMetadataTotalLen {
		return Errorf(CodeInvalidArgument, "metadata takes %d bytes, more than %d", total, MaxMetadataTotalLen)
	}
	return nil
}

func printable(s string) bool {
	for i := range len(s) {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
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
