// Package runtime defines the boundary between the lifecycle engine and the
// things that actually run sandboxes (the vm and gvisor runtimes). The engine
// owns records and state; a Runtime owns processes, memory and files on the
// host. Every implementation must pass the suite in runtimetest.
package runtime

import (
	"context"
	"errors"
	"net/netip"

	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/sandbox"
)

// Spec is everything a runtime needs to know about one sandbox.
type Spec struct {
	SandboxID string
	Template  sandbox.TemplateRef
	Resources sandbox.Resources
	Env       map[string]string
	// SnapshotDir is where Suspend writes and Restore reads the sandbox's
	// saved state. It is owned by the sandbox and removed by Delete.
	SnapshotDir string
	// Net is the sandbox's network, made by the engine before Create and
	// Restore and removed after Delete (nil: the sandbox has no network).
	Net *Net
	// Renetwork, set by the engine for Snapshot, readies the sandbox's
	// network for a start again (as before Restore); a runtime that saves a
	// sandbox by restarting it in place calls it before the restart.
	Renetwork func(ctx context.Context) error
	// Saved, when set for Snapshot, is called once as soon as dir holds the
	// complete save — possibly before the sandbox runs again — so copies
	// can start from it while the source is brought back. A Snapshot that
	// fails after calling it may leave dir behind: the caller removes it.
	Saved func()
	// Ephemeral, set for Snapshot, says the save only seeds copies started
	// from it now and is removed after (a fork's): a runtime may leave it
	// in the page cache rather than make it durable, and must then not
	// trust one found after the host restarted.
	Ephemeral bool
	// TakeImage, set for CreateFrom, says the image is this sandbox's
	// alone and goes once it runs (a fork's own save with one copy): a
	// runtime that would copy the image's files may use them in place.
	TakeImage bool
}

// NetKind is how a runtime plugs a sandbox into its network.
type NetKind string

// The kinds of network attachment.
const (
	// NetNone: the runtime gives its sandboxes no network.
	NetNone NetKind = ""
	// NetNamespace: a network namespace with a veth (eth0) configured
	// with the sandbox's address and default route; the runtime runs the
	// sandbox inside it (gvisor's netstack takes the interface over).
	NetNamespace NetKind = "netns"
	// NetTap: a network namespace holding a tap device (Tap) bridged to
	// the host; the runtime runs its VMM inside the namespace with the tap
	// as the virtual NIC's backend, and the guest configures its address
	// (vm).
	NetTap NetKind = "tap"
)

// Net is a sandbox's network attachment.
type Net struct {
	Kind NetKind
	// Netns is the path of the sandbox's network namespace.
	Netns string
	// Tap is the name of the tap device inside it (NetTap).
	Tap string
	// Address is the sandbox's address and prefix length, Gateway its
	// default route and DNS its resolver (SPACE's own).
	Address netip.Prefix
	Gateway netip.Addr
	DNS     netip.Addr
}

// Status is what a runtime observes of a sandbox on the host.
type Status string

// The observable statuses.
const (
	StatusRunning   Status = "running"
	StatusPaused    Status = "paused"
	StatusSuspended Status = "suspended" // only a snapshot on disk, nothing resident
	StatusAbsent    Status = "absent"    // nothing on the host
)

// ErrNotFound reports that the runtime has no such sandbox.
var ErrNotFound = errors.New("sandbox not found in runtime")

// Capabilities describe what a runtime can do on this host and why.
type Capabilities struct {
	// Net is how the runtime attaches sandboxes to a network.
	Net NetKind
	// Detail is a human sentence on how the runtime runs here (for example
	// the chosen acceleration and the reason).
	Detail string
	// Portable says a suspended sandbox's snapshot directory alone (as a
	// blob store keeps it) restores it on another host of the same runtime:
	// a cluster may wake it on any node.
	Portable bool
	// HostClock says the sandbox's clock is the host's (gVisor's sentry
	// reads it), so a resumed sandbox's clock is right at once; a VM's
	// guest clock stands still while paused and is set again on resume.
	HostClock bool
}

// Runtime runs sandboxes. Every method is safe for concurrent use on
// different sandboxes; the engine never runs two lifecycle methods on one
// sandbox at once. Every method is idempotent and safe to call again after
// the server crashed in the middle of it: calling it once more finishes or
// redoes the work. Methods never hold ctx beyond their return: a sandbox's
// processes outlive the request that created them.
type Runtime interface {
	// Name is the runtime's API name ("vm", "gvisor").
	Name() string
	// Capabilities reports what this runtime can do on this host.
	Capabilities() Capabilities
	// Create boots a sandbox from spec and returns once it is running and
	// its agent answers. Accepts: absent (or a half-made sandbox of the same
	// id, which it finishes or redoes). Cost: a boot or snapshot restore.
	Create(ctx context.Context, spec Spec) error
	// Pause freezes a running sandbox, keeping it resident. Accepts running
	// and paused (no-op). Cost: milliseconds.
	Pause(ctx context.Context, spec Spec) error
	// Resume unfreezes a paused sandbox. Accepts paused and running (no-op).
	Resume(ctx context.Context, spec Spec) error
	// Suspend saves memory, device state and filesystem to spec.SnapshotDir
	// and releases every host resource. Accepts running, paused and
	// suspended (no-op). Cost: proportional to dirty memory.
	Suspend(ctx context.Context, spec Spec) error
	// Restore brings a suspended sandbox back to running from
	// spec.SnapshotDir. Accepts suspended and running (no-op).
	Restore(ctx context.Context, spec Spec) error
	// Delete removes every process, mount, cgroup and file of the sandbox.
	// Accepts any status; absent is success.
	Delete(ctx context.Context, spec Spec) error
	// Recover re-adopts a sandbox after a server restart and reports what is
	// on the host. It never changes the sandbox's status.
	Recover(ctx context.Context, spec Spec) (Status, error)
	// Agent returns a live connection to the sandbox's agent, waiting for
	// it to connect until ctx ends. Accepts running (a paused sandbox's
	// agent does not answer). The runtime keeps the connection; callers
	// must not close it.
	Agent(ctx context.Context, spec Spec) (*agentclient.Client, error)
}

// Snapshotter is a runtime that can copy a live sandbox: save its whole
// state without stopping it, and start new, independent sandboxes from
// that save (fork; snapshots).
type Snapshotter interface {
	// Snapshot saves a running or paused sandbox's memory, kernel or device
	// state and file system into dir, which must not exist yet and exists
	// only once the save is complete, and leaves the sandbox as it was.
	// A failure (a full disk) leaves the sandbox as it was and no dir.
	// Cost: proportional to the memory the sandbox uses.
	Snapshot(ctx context.Context, spec Spec, dir string) error
	// CreateFrom starts a new sandbox spec (its own id, network, resources
	// equal to the saved sandbox's) from a Snapshot dir, which it only
	// reads and which may be removed once it returns. Accepts absent or
	// half-made, like Create.
	CreateFrom(ctx context.Context, spec Spec, dir string) error
}

// CopyPreparer is a Snapshotter that can do a copy's host-side start
// before the save it restores from exists, so that a fork overlaps that
// start with the source's save and CreateFrom then only loads the save
// (gVisor: the copy's sandbox process and gofer created, waiting for the
// image). PrepareCopy readies copy spec of sandbox source; it may be
// called again after a crash; Delete undoes it. CreateFrom accepts a copy
// prepared or not.
type CopyPreparer interface {
	PrepareCopy(ctx context.Context, spec, source Spec) error
}

// Templates gives a runtime a template digest's root file system and the
// environment and working directory the template asks for
// (internal/templates).
type Templates interface {
	RootfsPath(digest string) (string, error)
	Config(digest string) (env map[string]string, workdir string)
}

// FixedTemplate is Templates holding one template root, whatever the
// digest asked for, with no configuration: what a bare baseline runs.
type FixedTemplate string

func (f FixedTemplate) RootfsPath(string) (string, error)       { return string(f), nil }
func (FixedTemplate) Config(string) (map[string]string, string) { return nil, "" }

// Exit is a sandbox's processes ending on their own — not by a lifecycle
// call of the engine.
type Exit struct {
	SandboxID string
	// Reason is ExitOutOfMemory or ExitKilled.
	Reason  string
	Message string
}

// The reasons a sandbox's processes end unexpectedly.
const (
	ExitOutOfMemory = "out_of_memory" // its memory limit was reached
	ExitKilled      = "killed"        // killed from outside, or crashed
)

// ExitReporter is implemented by runtimes that notice at once when a
// sandbox's processes end unexpectedly; the engine marks it failed.
type ExitReporter interface {
	OnExit(func(Exit))
}

// StatusOf maps a sandbox state at rest to the status a runtime should
// observe for it ("" for states that are not at rest).
func StatusOf(s sandbox.State) Status {
	switch s {
	case sandbox.Running:
		return StatusRunning
	case sandbox.Paused:
		return StatusPaused
	case sandbox.Suspended:
		return StatusSuspended
	case sandbox.Deleted:
		return StatusAbsent
	}
	return ""
}

// StateOf maps an observed status back to the sandbox state at rest.
func StateOf(s Status) sandbox.State {
	switch s {
	case StatusRunning:
		return sandbox.Running
	case StatusPaused:
		return sandbox.Paused
	case StatusSuspended:
		return sandbox.Suspended
	case StatusAbsent:
		return sandbox.Deleted
	}
	return sandbox.Failed
}
