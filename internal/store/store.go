// Package store defines how SPACE records its durable state — sandboxes and
// operations, warm pools, idempotency records, API tokens and the templates
// sandboxes reference — as one role interface each, composed into Store.
// Implementations live in subpackages (sqlite); every implementation must pass
// the conformance suite in storetest.
package store

import (
	"context"
	"encoding/base64"
	"strconv"
	"strings"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
)

// Store is the durable state of a SPACE control plane: every role below on
// one database. Every method is safe for concurrent use. Methods that change a
// sandbox and its operation do so in one transaction, so a crash never leaves
// one without the other. Consumers take the role they use, not the Store.
type Store interface {
	Sandboxes
	Snapshots
	Pools
	Idempotency
	Tokens
	TemplateRefs
	Members
	Projects
	Audit
	// Ping checks the database answers a read (readiness).
	Ping(ctx context.Context) error
	Close() error
}

// Sandboxes records sandboxes and the operations that change them (and
// operations of no sandbox, such as template builds).
type Sandboxes interface {
	// CreateSandbox records a new sandbox and its create operation, and
	// completes idem (when non-nil) in the same transaction. When maxActive
	// > 0 and that many sandboxes are already active (neither deleted nor
	// failed) on its node, it stores nothing and returns
	// errdefs.ResourceExhausted.
	CreateSandbox(ctx context.Context, sb *sandbox.Sandbox, op *sandbox.Operation, idem *Completion, maxActive int) error
	// GetSandbox returns a sandbox, errdefs.NotFound when there is none.
	GetSandbox(ctx context.Context, id string) (*sandbox.Sandbox, error)
	// ListSandboxes returns one page of sandboxes in insertion order.
	ListSandboxes(ctx context.Context, q SandboxQuery) (Page[sandbox.Sandbox], error)
	// BeginOperation loads the sandbox op targets and lets decide check it and
	// apply the operation's start to both records; returning an error leaves
	// everything unchanged. It then stores the sandbox, inserts op and
	// completes the idempotency key decide returned (nil for none), all in
	// one transaction, and returns the updated sandbox.
	BeginOperation(ctx context.Context, op *sandbox.Operation, decide func(sb *sandbox.Sandbox, op *sandbox.Operation) (*Completion, error)) (*sandbox.Sandbox, error)
	// BeginFork is BeginOperation for a fork of op.SandboxID that also
	// inserts the new sandboxes forks in the same transaction. When
	// maxActive > 0 and the forks would take the server past that many
	// active sandboxes, it stores nothing and returns
	// errdefs.ResourceExhausted.
	BeginFork(ctx context.Context, op *sandbox.Operation, forks []*sandbox.Sandbox, maxActive int, decide func(sb *sandbox.Sandbox, op *sandbox.Operation) (*Completion, error)) (*sandbox.Sandbox, error)
	// CreateOperation records an operation that belongs to no sandbox (a
	// template build) and completes idem in the same transaction.
	CreateOperation(ctx context.Context, op *sandbox.Operation, idem *Completion) error
	// UpdateOperationState moves a non-terminal operation to state (running).
	UpdateOperationState(ctx context.Context, opID string, state sandbox.OpState, at time.Time) error
	// FinishOperation records an operation's terminal outcome and the state
	// its sandbox ends in, and clears the sandbox's active operation, in one
	// transaction (an operation without a sandbox only records its outcome).
	// Finishing an already terminal operation is a Conflict.
	FinishOperation(ctx context.Context, f Finish) error
	// GetOperation returns an operation, errdefs.NotFound when there is none.
	GetOperation(ctx context.Context, id string) (*sandbox.Operation, error)
	// ListOperations returns one page of operations in insertion order.
	ListOperations(ctx context.Context, q OperationQuery) (Page[sandbox.Operation], error)
	// UnfinishedOperations returns every operation not yet terminal of the
	// sandboxes on node, oldest first; node "" (a single machine) includes
	// the operations of no sandbox.
	UnfinishedOperations(ctx context.Context, node string) ([]sandbox.Operation, error)
	// UpdateSandbox applies mutate to a sandbox in one transaction; an error
	// from mutate leaves it unchanged. It returns the updated sandbox.
	UpdateSandbox(ctx context.Context, id string, mutate func(sb *sandbox.Sandbox) error) (*sandbox.Sandbox, error)
	// CountSandboxes counts sandboxes by state, separately for warm-pool
	// sandboxes (pooled=true) and users' (deleted ones are not counted).
	CountSandboxes(ctx context.Context) ([]SandboxCount, error)
	// TouchSandbox sets a sandbox's last_active_at.
	TouchSandbox(ctx context.Context, id string, at time.Time) error
}

// Snapshots records saved sandboxes.
type Snapshots interface {
	// BeginSnapshot is BeginOperation for a snapshot of op.SandboxID that
	// also inserts the snapshot record snap in the same transaction.
	BeginSnapshot(ctx context.Context, op *sandbox.Operation, snap *sandbox.Snapshot, decide func(sb *sandbox.Sandbox, op *sandbox.Operation) (*Completion, error)) (*sandbox.Sandbox, error)
	// GetSnapshot returns a snapshot, errdefs.NotFound when there is none.
	GetSnapshot(ctx context.Context, id string) (*sandbox.Snapshot, error)
	// ListSnapshots returns one page of snapshots in insertion order.
	ListSnapshots(ctx context.Context, q SnapshotQuery) (Page[sandbox.Snapshot], error)
	// DeleteSnapshot removes a snapshot's record once check accepts it
	// (in the same transaction); NotFound when there is none.
	DeleteSnapshot(ctx context.Context, id string, check func(*sandbox.Snapshot) error) error
	// TagSnapshot makes ref (a template reference, name:tag) start
	// sandboxes from snapshot id once check accepts it: the tag moves from
	// any other snapshot, and replaces the snapshot's own. An empty ref
	// removes the snapshot's tag. It returns the snapshot as tagged.
	TagSnapshot(ctx context.Context, id, ref string, check func(*sandbox.Snapshot) error) (*sandbox.Snapshot, error)
	// SnapshotByTag returns the snapshot tagged ref, errdefs.NotFound
	// when there is none.
	SnapshotByTag(ctx context.Context, ref string) (*sandbox.Snapshot, error)
}

// SnapshotQuery selects a page of snapshots.
type SnapshotQuery struct {
	Project   string // empty: every project
	SandboxID string // empty: all
	Name      string // empty: any
	Cursor    string
	Limit     int
}

// Pools records warm-pool settings and claims pool sandboxes.
type Pools interface {
	// ClaimPoolSandbox takes one running, idle sandbox of pool in one
	// transaction: claim turns it into the user's sandbox and returns the
	// create operation to record; idem is completed with it. NotFound when
	// the pool has none ready. No sandbox is ever claimed twice.
	ClaimPoolSandbox(ctx context.Context, pool string, claim func(sb *sandbox.Sandbox) (*sandbox.Operation, *Completion, error)) (*sandbox.Sandbox, *sandbox.Operation, error)
	// PoolSandboxes lists a pool's sandboxes (every state but deleted).
	PoolSandboxes(ctx context.Context, pool string) ([]sandbox.Sandbox, error)
	// PoolKeys lists the pools that have sandboxes (in any state but
	// deleted).
	PoolKeys(ctx context.Context) ([]string, error)
	// SetWarmPool records how many ready sandboxes of a template project
	// keeps (0 drains the pool), within the project's warm_pool quota;
	// WarmPools lists the settings.
	SetWarmPool(ctx context.Context, pool PoolRef, minReady int) error
	WarmPools(ctx context.Context) (map[PoolRef]int, error)
}

// PoolRef names a warm pool: a project's pool of a template.
type PoolRef struct {
	Project  string
	Template string
}

// Idempotency records idempotency keys and the responses they replay.
type Idempotency interface {
	// ReserveIdempotencyKey records key as in flight for owner unless it
	// exists. It returns the existing record (reserved=false) or the new one.
	ReserveIdempotencyKey(ctx context.Context, r IdempotencyRecord) (rec *IdempotencyRecord, reserved bool, err error)
	// GetIdempotencyKey returns a record, errdefs.NotFound when there is none.
	GetIdempotencyKey(ctx context.Context, key string) (*IdempotencyRecord, error)
	// CompleteIdempotencyKey stores the response of an in-flight key, or
	// of a key reserved in memory (Completion.New).
	CompleteIdempotencyKey(ctx context.Context, c Completion) error
	// ReleaseIdempotencyKey deletes an in-flight reservation so the request
	// can be retried (used when it failed without changing anything).
	ReleaseIdempotencyKey(ctx context.Context, key string) error
	// PruneIdempotencyKeys deletes completed records that expired before now
	// and in-flight reservations held by any owner not in liveOwners (their
	// process is gone and its transaction never committed).
	PruneIdempotencyKeys(ctx context.Context, now time.Time, liveOwners ...string) (int, error)
	// TakeOverIdempotencyKey gives an in-flight reservation held by
	// deadOwner (a process that is gone) to owner; false when the key is
	// no longer in flight under deadOwner.
	TakeOverIdempotencyKey(ctx context.Context, key, deadOwner, owner string) (bool, error)
}

// Members records the processes of a cluster: nodes, which run sandboxes,
// and control replicas, which serve the API; each heartbeats.
type Members interface {
	// JoinMember records m as alive now: a new member is inserted, a
	// known one (a node restarted) takes m's boot id, addresses, capacity
	// and labels; a node keeps a cordon or drain, and a lost one is
	// ready again. It returns the member as recorded.
	JoinMember(ctx context.Context, m *Member) (*Member, error)
	// HeartbeatMember records that member id, running as bootID, is alive
	// at at, and returns it as recorded; NotFound when there is no such
	// member, Conflict when another process took its id (another boot id).
	HeartbeatMember(ctx context.Context, id, bootID string, at time.Time) (*Member, error)
	// GetMember returns a member, errdefs.NotFound when there is none.
	GetMember(ctx context.Context, id string) (*Member, error)
	// ListMembers returns the members of a role ("" for every role).
	ListMembers(ctx context.Context, role MemberRole) ([]Member, error)
	// SetMemberState changes a node's state (cordon, drain, ready) and
	// returns it; NotFound when there is none.
	SetMemberState(ctx context.Context, id string, state MemberState) (*Member, error)
	// MarkLostMembers marks every member not lost whose last heartbeat is
	// before staleBefore lost, and returns them.
	MarkLostMembers(ctx context.Context, staleBefore time.Time) ([]Member, error)
	// LeaveMember removes a control replica that stops (a node stays
	// recorded: its sandboxes name it).
	LeaveMember(ctx context.Context, id, bootID string) error
	// NodeLoads sums what the active sandboxes of each node reserve.
	NodeLoads(ctx context.Context) (map[string]NodeLoad, error)
}

// MemberRole is what a cluster process does.
type MemberRole string

// The roles.
const (
	RoleNode    MemberRole = "node"
	RoleControl MemberRole = "control"
)

// MemberState is a member's standing in the cluster.
type MemberState string

// The member states. Only a ready node takes new sandboxes.
const (
	MemberReady    MemberState = "ready"
	MemberCordoned MemberState = "cordoned" // runs what it has, takes nothing new
	MemberDraining MemberState = "draining" // cordoned, and its sandboxes are being suspended
	MemberLost     MemberState = "lost"     // stopped heartbeating
)

// Member is one process of a cluster.
type Member struct {
	// ID is a node's stable id (node_…, kept in its data directory) or a
	// control replica's boot id.
	ID     string     `json:"id"`
	Role   MemberRole `json:"role"`
	Name   string     `json:"name"`
	BootID string     `json:"boot_id"`
	// URL is where the cluster reaches a node's API (control → node);
	// DataPlaneURL and ECWURL are where clients reach its data plane and
	// E2B listener.
	URL          string            `json:"url,omitempty"`
	DataPlaneURL string            `json:"data_plane_url,omitempty"`
	ECWURL       string            `json:"ecw_url,omitempty"`
	Capacity     Capacity          `json:"capacity"`
	Labels       map[string]string `json:"labels,omitempty"`
	// Templates are the template digests a node has cached.
	Templates   []string    `json:"templates,omitempty"`
	State       MemberState `json:"state"`
	StartedAt   time.Time   `json:"started_at"`
	HeartbeatAt time.Time   `json:"heartbeat_at"`
}

// Capacity is what a node offers sandboxes.
type Capacity struct {
	VCPUs        int      `json:"vcpus"`
	MemoryMiB    int      `json:"memory_mib"`
	DiskMiB      int      `json:"disk_mib"`
	MaxSandboxes int      `json:"max_sandboxes"` // 0: no cap
	Runtimes     []string `json:"runtimes"`
	// Portable are the runtimes whose suspended sandboxes this node can
	// restore from a blob store alone (a wake may move them here).
	Portable     []string `json:"portable,omitempty"`
	Acceleration string   `json:"acceleration,omitempty"`
}

// NodeLoad is what a node's active sandboxes (neither deleted nor failed)
// reserve.
type NodeLoad struct {
	Sandboxes int `json:"sandboxes"`
	VCPUs     int `json:"vcpus"`
	MemoryMiB int `json:"memory_mib"`
}

// TemplateRefs says which templates the recorded sandboxes were made from,
// so template garbage collection keeps them.
type TemplateRefs interface {
	// ClaimTemplate records that project builds template name (counted
	// against its templates quota the first time); Conflict when another
	// project owns the name.
	ClaimTemplate(ctx context.Context, project, name string, at time.Time) error
	// TemplateOwners maps every template name a project built to its
	// project; a name missing is shared (builtin, or built before projects).
	TemplateOwners(ctx context.Context) (map[string]string, error)
	// TemplatesInUse returns the template digests of every sandbox that is
	// not deleted (warm-pool sandboxes and failed ones included) and of
	// every snapshot.
	TemplatesInUse(ctx context.Context) (map[string]bool, error)
}

// Tokens records API tokens (their hashes, never their values).
type Tokens interface {
	// CreateToken stores an API token (its hash, never its value).
	CreateToken(ctx context.Context, t *Token) error
	// TokenByHash returns the token with hash h, errdefs.NotFound when none.
	TokenByHash(ctx context.Context, h string) (*Token, error)
	// TokenByID returns the token with id, errdefs.NotFound when none.
	TokenByID(ctx context.Context, id string) (*Token, error)
	// ListTokens returns every token of project ("": of every project),
	// revoked ones included.
	ListTokens(ctx context.Context, project string) ([]Token, error)
	// RevokeToken marks a token revoked; NotFound when there is none.
	RevokeToken(ctx context.Context, id string, at time.Time) error
}

// Finish is the terminal outcome of an operation.
type Finish struct {
	OperationID  string
	State        sandbox.OpState // OpSucceeded or OpFailed
	Error        *sandbox.ErrorInfo
	SandboxState sandbox.State
	SandboxError *sandbox.ErrorInfo
	// Others are further sandboxes the operation made (a fork's): each
	// ends in its state, and loses the operation as its active one.
	Others []Outcome
	// Snapshot is the outcome of the snapshot a snapshot operation makes.
	Snapshot *SnapshotOutcome
	At       time.Time
}

// SnapshotOutcome is the state a snapshot ends in.
type SnapshotOutcome struct {
	SnapshotID string
	State      sandbox.SnapshotState
	SizeBytes  int64
	Error      *sandbox.ErrorInfo
}

// Outcome is the state one sandbox ends in.
type Outcome struct {
	SandboxID string
	State     sandbox.State
	Error     *sandbox.ErrorInfo
}

// SandboxCount is how many sandboxes are in a state.
type SandboxCount struct {
	State  sandbox.State
	Pooled bool
	Count  int
}

// SandboxQuery selects a page of sandboxes.
type SandboxQuery struct {
	// Project, when set, lists only that project's sandboxes.
	Project string
	State   sandbox.State // empty: every state but deleted
	Cursor  string
	Limit   int
	// IncludePool lists warm-pool sandboxes too (the engine's own sweeps).
	IncludePool bool
	// Node, when set, lists only the sandboxes on that node.
	Node *string
}

// EachSandbox calls fn for every sandbox in state (empty: every state but
// deleted), warm-pool sandboxes included, one page at a time. It stops at
// the first error listing a page.
func EachSandbox(ctx context.Context, st Sandboxes, state sandbox.State, fn func(*sandbox.Sandbox)) error {
	return EachSandboxOn(ctx, st, nil, state, fn)
}

// EachSandboxOn is EachSandbox for the sandboxes on one node (nil: on any).
func EachSandboxOn(ctx context.Context, st Sandboxes, node *string, state sandbox.State, fn func(*sandbox.Sandbox)) error {
	q := SandboxQuery{State: state, Limit: MaxLimit, IncludePool: true, Node: node}
	for {
		page, err := st.ListSandboxes(ctx, q)
		if err != nil {
			return err
		}
		for i := range page.Items {
			fn(&page.Items[i])
		}
		if page.Next == "" {
			return nil
		}
		q.Cursor = page.Next
	}
}

// OperationQuery selects a page of operations.
type OperationQuery struct {
	Project   string // empty: every project
	SandboxID string // empty: all
	Cursor    string
	Limit     int
}

// Page is one page of a list and the cursor of the next ("" at the end).
type Page[T any] struct {
	Items []T
	Next  string
}

// IdemState is the progress of an idempotent request.
type IdemState string

// The idempotency record states.
const (
	IdemInFlight IdemState = "in_flight"
	IdemDone     IdemState = "done"
)

// IdempotencyRecord remembers one idempotent request and, once done, its
// response.
type IdempotencyRecord struct {
	Key         string
	Fingerprint string // hash of method, path and body
	Owner       string // process holding an in-flight reservation
	State       IdemState
	Status      int
	Body        []byte
	Location    string
	CreatedAt   time.Time
	ExpiresAt   time.Time
}

// Completion is the response to store for an idempotency key. Body is called
// inside the transaction that makes the change, after the change is applied.
type Completion struct {
	Key      string
	Status   int
	Location string
	Body     func() ([]byte, error)
	// New, when set, is the key's record to insert done: its reservation
	// was held in the memory of a process that no other shares the store
	// with, not in the store. A live record under the key (done and not
	// expired, or in flight) refuses it with errdefs.Conflict.
	New *IdempotencyRecord
}

// Token is an API token's record; the token's value is never stored.
type Token struct {
	ID        string
	Name      string
	Hash      string // hex sha256 of the token value
	Project   string
	Role      Role
	CreatedAt time.Time
	// ExpiresAt, when set, is when the token stops working.
	ExpiresAt *time.Time
	RevokedAt *time.Time
	// RatePerSec and Burst bound the token's requests (0: no bound).
	RatePerSec float64
	Burst      int
}

// Role is what a token may do in its project.
type Role string

// The roles, from most to least allowed. An owner manages the server's
// projects (and anything an admin may do in its own project); an admin its
// project's tokens, quotas within the owner's, warm pools and templates; a
// member its sandboxes, commands and files; read-only lists, reads files and
// attaches to output.
const (
	RoleOwner    Role = "owner"
	RoleAdmin    Role = "admin"
	RoleMember   Role = "member"
	RoleReadOnly Role = "read-only"
)

// Rank orders roles (0: not a role).
func (r Role) Rank() int {
	switch r {
	case RoleOwner:
		return 4
	case RoleAdmin:
		return 3
	case RoleMember:
		return 2
	case RoleReadOnly:
		return 1
	}
	return 0
}

// Limits for list pages.
const (
	DefaultLimit = 50
	MaxLimit     = 500
)

// EncodeCursor makes an opaque cursor from an insertion sequence number.
func EncodeCursor(seq int64) string {
	return base64.RawURLEncoding.EncodeToString([]byte("s" + strconv.FormatInt(seq, 10)))
}

// DecodeCursor parses a cursor made by EncodeCursor; "" means the start.
func DecodeCursor(c string) (int64, error) {
	if c == "" {
		return 0, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil || len(b) < 2 || b[0] != 's' || strings.HasPrefix(string(b[1:]), "+") {
		return 0, errdefs.New(errdefs.InvalidArgument, "malformed cursor")
	}
	seq, err := strconv.ParseInt(string(b[1:]), 10, 64)
	if err != nil || seq < 0 {
		return 0, errdefs.New(errdefs.InvalidArgument, "malformed cursor")
	}
	return seq, nil
}

// NormalizeLimit applies the default and checks the bounds.
func NormalizeLimit(n int) (int, error) {
	if n == 0 {
		return DefaultLimit, nil
	}
	if n < 1 || n > MaxLimit {
		return 0, errdefs.New(errdefs.InvalidArgument, "limit must be between 1 and %d", MaxLimit)
	}
	return n, nil
}
