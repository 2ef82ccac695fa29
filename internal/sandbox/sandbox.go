// Package sandbox defines the sandbox and operation records and the lifecycle
// state machine: which states exist, which operations each state accepts, and
// what a sandbox passes through while an operation runs. It is pure logic; the
// lifecycle engine acts on it and the store persists it.
package sandbox

import (
	"maps"
	"slices"
	"strings"
	"time"
)

// State is a sandbox's lifecycle state.
type State string

// The states. Transitional states (…ing) mean an operation is in flight.
const (
	Starting   State = "starting"
	Running    State = "running"
	Pausing    State = "pausing"
	Paused     State = "paused"
	Resuming   State = "resuming"
	Suspending State = "suspending"
	Suspended  State = "suspended"
	Restoring  State = "restoring"
	Deleting   State = "deleting"
	Deleted    State = "deleted"
	Failed     State = "failed"
)

// States lists every state in documentation order.
var States = []State{Starting, Running, Pausing, Paused, Resuming, Suspending, Suspended, Restoring, Deleting, Deleted, Failed}

// Valid reports whether s is a known state.
func (s State) Valid() bool {
	for _, k := range States {
		if s == k {
			return true
		}
	}
	return false
}

// Resources are the limits a sandbox runs with.
type Resources struct {
	VCPUs     int `json:"vcpus"`
	MemoryMiB int `json:"memory_mib"`
	DiskMiB   int `json:"disk_mib"`
}

// AutoLifecycle is the idle policy and the timeout of a sandbox.
type AutoLifecycle struct {
	IdleTimeout string `json:"idle_timeout"`
	IdleAction  string `json:"idle_action"`
	// Timeout bounds each stretch of running time: when a sandbox has run
	// this long since it last became running, TimeoutAction (delete or
	// suspend) runs. "" or "0s": no timeout.
	Timeout       string `json:"timeout,omitempty"`
	TimeoutAction string `json:"timeout_action,omitempty"`
}

// FormatDuration writes d as a duration string of the API the way people
// write one: "10m", "1h30m", "1h", "1m30s", "1.5s" — Go's "10m0s" without its
// zero tail, so a server default reads like what a client would send.
func FormatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// TimeoutDuration is the parsed Timeout (0 for none).
func (a AutoLifecycle) TimeoutDuration() time.Duration {
	d, err := time.ParseDuration(a.Timeout)
	if err != nil || d < 0 {
		return 0
	}
	return d
}

// TemplateRef is the template a sandbox was created from: the reference the
// user gave and the digest it resolved to.
type TemplateRef struct {
	Ref    string `json:"ref"`
	Digest string `json:"digest"`
}

// ErrorInfo is a failure recorded on a sandbox or operation.
type ErrorInfo struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Sandbox is the durable record of one sandbox.
type Sandbox struct {
	ID string `json:"id"`
	// Project is the project the sandbox belongs to.
	Project       string            `json:"project"`
	State         State             `json:"state"`
	Template      TemplateRef       `json:"template"`
	Runtime       string            `json:"runtime"`
	Resources     Resources         `json:"resources"`
	Env           map[string]string `json:"env"`
	Metadata      map[string]string `json:"metadata"`
	AutoLifecycle AutoLifecycle     `json:"auto_lifecycle"`
	// Network is the sandbox's network policy (nil: a record from before
	// sandboxes had networks, treated as egress none).
	Network *Network `json:"network,omitempty"`
	// ForkOf is the sandbox this one was forked from ("" for one made from
	// a template).
	ForkOf string `json:"fork_of,omitempty"`
	// Snapshot is the snapshot this sandbox was created from ("" for one
	// made from a template).
	Snapshot string `json:"snapshot,omitempty"`
	// Node is the cluster node that runs the sandbox, or last ran it ("" on
	// a single machine, where the server runs every sandbox itself).
	Node         string    `json:"node,omitempty"`
	CreatedAt    time.Time `json:"created_at"`
	UpdatedAt    time.Time `json:"updated_at"`
	LastActiveAt time.Time `json:"last_active_at"`
	// ExpiresAt is when a running sandbox's timeout action runs (nil without
	// a timeout or when it is not running).
	ExpiresAt *time.Time `json:"expires_at"`
	Error     *ErrorInfo `json:"error"`

	// ActiveOperation is the id of the lifecycle operation in flight, if any.
	// At most one is in flight per sandbox.
	ActiveOperation string `json:"-"`
	// Pool is the warm pool a sandbox waits in to be claimed ("" for the
	// user's sandboxes). Pool sandboxes are not listed.
	Pool string `json:"-"`
}

// Clone is a deep copy of sb: the copy shares no map, slice or pointer
// with sb (nil and empty maps stay as they are).
func (sb *Sandbox) Clone() *Sandbox {
	c := *sb
	c.Env, c.Metadata = maps.Clone(sb.Env), maps.Clone(sb.Metadata)
	c.Network = sb.Network.Clone()
	if sb.ExpiresAt != nil {
		t := *sb.ExpiresAt
		c.ExpiresAt = &t
	}
	if sb.Error != nil {
		e := *sb.Error
		c.Error = &e
	}
	return &c
}

// OpKind is the kind of a lifecycle operation.
type OpKind string

// The operation kinds.
const (
	OpCreate  OpKind = "create"
	OpPause   OpKind = "pause"
	OpSuspend OpKind = "suspend"
	OpWake    OpKind = "wake"
	OpDelete  OpKind = "delete"
	// OpFork copies a running or paused sandbox into new ones (its
	// Sandboxes); the source is left as it was.
	OpFork OpKind = "fork"
	// OpSnapshot saves a running or paused sandbox as a snapshot; the
	// source is left as it was.
	OpSnapshot OpKind = "snapshot"
	// OpBuild builds a template; it has no sandbox.
	OpBuild OpKind = "build"
)

// MaxForks is how many sandboxes one fork makes at most.
const MaxForks = 16

// OpState is the progress of an operation.
type OpState string

// The operation states; Succeeded and Failed are terminal.
const (
	OpPending   OpState = "pending"
	OpRunning   OpState = "running"
	OpSucceeded OpState = "succeeded"
	OpFailed    OpState = "failed"
)

// Terminal reports whether s is a final outcome.
func (s OpState) Terminal() bool { return s == OpSucceeded || s == OpFailed }

// Operation is the durable record of one asynchronous lifecycle change.
type Operation struct {
	ID string `json:"id"`
	// Project is the project of the operation's sandbox (or template).
	Project   string `json:"project"`
	Kind      OpKind `json:"kind"`
	SandboxID string `json:"sandbox_id,omitempty"`
	// Template is the name:tag a build operation makes.
	Template string `json:"template,omitempty"`
	// Snapshot is the snapshot a snapshot operation makes.
	Snapshot string `json:"snapshot,omitempty"`
	// Sandboxes are the new sandboxes a fork operation makes.
	Sandboxes   []string   `json:"sandboxes,omitempty"`
	State       OpState    `json:"state"`
	Error       *ErrorInfo `json:"error"`
	CreatedAt   time.Time  `json:"created_at"`
	UpdatedAt   time.Time  `json:"updated_at"`
	CompletedAt *time.Time `json:"completed_at"`

	// From is the sandbox state the operation started from; the engine
	// returns the sandbox to it when the runtime reports the change did not
	// happen.
	From State `json:"-"`
}

// SetState moves sb to state at `at` and keeps its deadline true: a sandbox
// that becomes running has until at + timeout (a later deadline, set by an
// extension, stays); one that is not running has none. Paused and suspended
// time therefore never counts against the timeout.
func (sb *Sandbox) SetState(state State, at time.Time) {
	was := sb.State
	sb.State, sb.UpdatedAt = state, at
	switch {
	case state != Running:
		sb.ExpiresAt = nil
	case was != Running || sb.ExpiresAt == nil:
		sb.ExpiresAt = nil
		if d := sb.AutoLifecycle.TimeoutDuration(); d > 0 {
			t := at.Add(d)
			sb.ExpiresAt = &t
		}
	}
}

// Network is a sandbox's network policy as the client gave it (see
// internal/netpolicy for what it means and how it is checked).
type Network struct {
	// Egress is the default for destinations no rule names: "public" or
	// "none".
	Egress string `json:"egress"`
	// Allow and Deny are CIDRs ("203.0.113.0/24", "198.51.100.7") or domain
	// names ("pypi.org", "*.github.com"). Allow wins over Deny, both win
	// over Egress; the floor wins over all.
	Allow []string `json:"allow"`
	Deny  []string `json:"deny"`
	// PublicIngress lets anyone reach the sandbox's ports without its
	// ingress token.
	PublicIngress bool `json:"public_ingress"`
	// IngressToken reaches the sandbox's ports through the data plane. It
	// is derived from the sandbox id when a sandbox is shown, never stored.
	IngressToken string `json:"ingress_token,omitempty"`
}

// Clone is a deep copy of n (nil for nil).
func (n *Network) Clone() *Network {
	if n == nil {
		return nil
	}
	c := *n
	c.Allow, c.Deny = slices.Clone(n.Allow), slices.Clone(n.Deny)
	return &c
}

// SnapshotState is the progress of a snapshot.
type SnapshotState string

// The snapshot states.
const (
	SnapshotCreating SnapshotState = "creating"
	SnapshotReady    SnapshotState = "ready"
	SnapshotFailed   SnapshotState = "failed"
)

// Snapshot is a saved sandbox: memory, kernel or device state and file
// system at one instant, immutable, independent of its source. Sandboxes
// created from it start where it was taken.
type Snapshot struct {
	ID        string        `json:"id"`
	Project   string        `json:"project"`
	Name      string        `json:"name,omitempty"`
	SandboxID string        `json:"sandbox_id"`
	State     SnapshotState `json:"state"`
	// What a sandbox made from it is: the source's template, runtime,
	// resources and environment.
	Template  TemplateRef       `json:"template"`
	Runtime   string            `json:"runtime"`
	Resources Resources         `json:"resources"`
	Env       map[string]string `json:"env"`
	// Tag is the template reference (name:tag) that starts sandboxes from
	// this snapshot, if it is tagged as one: a create of that template
	// (and its warm pool) starts from the snapshot.
	Tag string `json:"tag,omitempty"`
	// SizeBytes is the disk it takes (0 until ready).
	SizeBytes int64 `json:"size_bytes"`
	// Node is the cluster node whose disk holds the snapshot ("" on a
	// single machine); sandboxes made from it start there.
	Node        string     `json:"node,omitempty"`
	OperationID string     `json:"operation_id"`
	Error       *ErrorInfo `json:"error"`
	CreatedAt   time.Time  `json:"created_at"`
	UpdatedAt   time.Time  `json:"updated_at"`
}
