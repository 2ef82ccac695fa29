package store

import (
	"context"
	"regexp"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
)

// DefaultProject is the project every server starts with; records made
// before projects existed belong to it.
const DefaultProject = "default"

// ProjectOr is a record's project: records made before projects existed,
// and requests the server makes itself, are the default project's.
func ProjectOr(p string) string {
	if p == "" {
		return DefaultProject
	}
	return p
}

var projectName = regexp.MustCompile(`^[a-z][a-z0-9-]{0,38}[a-z0-9]$|^[a-z]$`)

// ValidProject checks a project's name (its id): 1 to 40 lowercase
// letters, digits and dashes, starting with a letter, not ending in a dash.
func ValidProject(name string) error {
	if !projectName.MatchString(name) {
		return errdefs.New(errdefs.InvalidArgument, "project name %q must be 1 to 40 lowercase letters, digits and dashes, starting with a letter", name)
	}
	return nil
}

// Projects records the projects sandboxes, tokens and the rest belong to,
// and each project's quotas.
type Projects interface {
	// CreateProject records a project; Conflict when the name is taken.
	CreateProject(ctx context.Context, p *Project) error
	// GetProject returns a project, errdefs.NotFound when there is none.
	GetProject(ctx context.Context, name string) (*Project, error)
	// ListProjects returns every project by name.
	ListProjects(ctx context.Context) ([]Project, error)
	// DeleteProject removes a project that holds nothing (no sandbox but
	// deleted ones, no snapshot, no token not revoked): Conflict otherwise;
	// the default project cannot be removed.
	DeleteProject(ctx context.Context, name string) error
	// UpdateProject applies change to a project in one transaction (an
	// error leaves it as it was) and returns it as stored.
	UpdateProject(ctx context.Context, name string, change func(*Project) error) (*Project, error)
	// ProjectUsage sums what a project's sandboxes, snapshots and warm
	// pools hold now.
	ProjectUsage(ctx context.Context, name string) (Usage, error)
}

// Project is one tenant of a server: every sandbox, operation, snapshot,
// warm pool, idempotency key and token belongs to exactly one.
type Project struct {
	Name string `json:"name"`
	// Limits are set by the server's owner; Quotas by the project's
	// admins, each within its limit. What is enforced is Effective.
	Limits    Quotas    `json:"limits"`
	Quotas    Quotas    `json:"quotas"`
	CreatedAt time.Time `json:"created_at"`
}

// Effective is what admissions check: each quota, bounded by its limit (a
// quota of 0 under a limit is the limit).
func (p *Project) Effective() Quotas {
	eff := func(q, l int) int {
		if l > 0 && (q == 0 || q > l) {
			return l
		}
		return q
	}
	q, l := p.Quotas, p.Limits
	return Quotas{Sandboxes: eff(q.Sandboxes, l.Sandboxes), RunningSandboxes: eff(q.RunningSandboxes, l.RunningSandboxes),
		VCPUs: eff(q.VCPUs, l.VCPUs), MemoryMiB: eff(q.MemoryMiB, l.MemoryMiB), DiskMiB: eff(q.DiskMiB, l.DiskMiB),
		SnapshotMiB: eff(q.SnapshotMiB, l.SnapshotMiB), Templates: eff(q.Templates, l.Templates), WarmPool: eff(q.WarmPool, l.WarmPool)}
}

// Within refuses quotas q above limits l (InvalidArgument naming the first).
func (q Quotas) Within(l Quotas) error {
	lim, v := l.named(), q.named()
	for _, name := range quotaNames {
		if lim[name] > 0 && v[name] > lim[name] {
			return errdefs.New(errdefs.InvalidArgument, "quota %s (%d) is above the limit the server's owner set (%d)", name, v[name], lim[name]).
				WithDetails(map[string]any{"field": name, "limit": lim[name]})
		}
	}
	return nil
}

// Quotas bound what a project may hold; 0 is no bound.
type Quotas struct {
	// Sandboxes counts every sandbox not deleted (suspended and failed
	// ones too); RunningSandboxes those that hold memory on a host (not
	// suspended, failed or deleted), and VCPUs and MemoryMiB sum what
	// those reserve. DiskMiB sums every sandbox not deleted.
	Sandboxes        int `json:"sandboxes"`
	RunningSandboxes int `json:"running_sandboxes"`
	VCPUs            int `json:"vcpus"`
	MemoryMiB        int `json:"memory_mib"`
	DiskMiB          int `json:"disk_mib"`
	// SnapshotMiB sums the size of the project's snapshots.
	SnapshotMiB int `json:"snapshot_mib"`
	// Templates counts the template names the project built.
	Templates int `json:"templates"`
	// WarmPool sums min_ready over the project's warm pools.
	WarmPool int `json:"warm_pool"`
}

// quotaNames orders the quotas (their JSON names) in errors.
var quotaNames = []string{"sandboxes", "running_sandboxes", "vcpus", "memory_mib", "disk_mib", "snapshot_mib", "templates", "warm_pool"}

// Validate checks every bound is 0 (none) or positive and not absurd.
func (q Quotas) Validate() error {
	v := q.named()
	for _, name := range quotaNames {
		if v[name] < 0 || v[name] > 1<<30 {
			return errdefs.New(errdefs.InvalidArgument, "quota %s must be between 0 (no limit) and %d", name, 1<<30)
		}
	}
	return nil
}

func (q Quotas) named() map[string]int {
	return map[string]int{"sandboxes": q.Sandboxes, "running_sandboxes": q.RunningSandboxes, "vcpus": q.VCPUs,
		"memory_mib": q.MemoryMiB, "disk_mib": q.DiskMiB, "snapshot_mib": q.SnapshotMiB, "templates": q.Templates, "warm_pool": q.WarmPool}
}

// Usage is what a project holds, in the units of its Quotas.
type Usage Quotas

// Admit refuses adding more to u when that would take it past q: the
// error is errdefs.ResourceExhausted and names the quota. Only the
// dimensions more increases are checked, so a project already over a
// lowered quota can still do what does not add to it.
func (q Quotas) Admit(u, more Usage) error {
	limit, used, by := q.named(), Quotas(u).named(), Quotas(more).named()
	for _, name := range quotaNames {
		if l := limit[name]; l > 0 && by[name] > 0 && used[name]+by[name] > l {
			return errdefs.New(errdefs.ResourceExhausted, "project quota %s exceeded: %d in use, %d more asked, quota %d", name, used[name], by[name], l).
				WithDetails(map[string]any{"quota": name, "limit": l, "used": used[name], "requested": by[name]})
		}
	}
	return nil
}

// Audit records who changed what, append-only.
type Audit interface {
	// AppendAudit appends entries (each gets its sequence number).
	AppendAudit(ctx context.Context, entries []AuditEntry) error
	// ListAudit returns one page of entries, oldest first.
	ListAudit(ctx context.Context, q AuditQuery) (Page[AuditEntry], error)
}

// AuditEntry is one mutation as the API saw it. It never holds a secret: no
// token value, no body, no environment value.
type AuditEntry struct {
	At        time.Time `json:"at"`
	Project   string    `json:"project"`
	TokenID   string    `json:"token_id"`
	TokenName string    `json:"token_name"`
	Role      string    `json:"role"`
	// Action is the route: method and pattern ("POST /v1/sandboxes/{id}:pause").
	Action string `json:"action"`
	// Target is the object the path names ("" for a create), and
	// Operation the operation the request started, if any.
	Target    string `json:"target,omitempty"`
	Operation string `json:"operation,omitempty"`
	Status    int    `json:"status"`
	// Outcome is "ok", or the error code the client got.
	Outcome   string `json:"outcome"`
	RequestID string `json:"request_id"`
	Listener  string `json:"listener"`
}

// AuditQuery selects a page of audit entries.
type AuditQuery struct {
	Project string // empty: every project
	TokenID string // empty: any
	Action  string // a substring of the action; empty: any
	Since   time.Time
	Cursor  string
	Limit   int
}
