package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// Resources are a sandbox's limits.
type Resources struct {
	VCPUs     int `json:"vcpus,omitempty"`
	MemoryMiB int `json:"memory_mib,omitempty"`
	DiskMiB   int `json:"disk_mib,omitempty"`
}

// AutoLifecycle is a sandbox's idle policy.
type AutoLifecycle struct {
	IdleTimeout string `json:"idle_timeout,omitempty"`
	IdleAction  string `json:"idle_action,omitempty"`
	// Timeout bounds each stretch of running time: TimeoutAction (delete
	// or suspend) runs when the sandbox has run this long since it last
	// became running (Sandbox.ExpiresAt).
	Timeout       string `json:"timeout,omitempty"`
	TimeoutAction string `json:"timeout_action,omitempty"`
}

// ErrorInfo is a failure recorded on a sandbox or operation.
type ErrorInfo struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Sandbox is a sandbox as the API shows it.
type Sandbox struct {
	ID string `json:"id"`
	// Project is the project it belongs to (the token's).
	Project       string            `json:"project"`
	State         string            `json:"state"`
	Template      TemplateRef       `json:"template"`
	Runtime       string            `json:"runtime"`
	Resources     Resources         `json:"resources"`
	Env           map[string]string `json:"env"`
	Metadata      map[string]string `json:"metadata"`
	AutoLifecycle AutoLifecycle     `json:"auto_lifecycle"`
	// Network is the sandbox's network policy and, unless its ports are
	// public, the token that reaches them (nil from a server without
	// sandbox networking).
	Network *Network `json:"network,omitempty"`
	// ExpiresAt is when a running sandbox's timeout action runs (nil
	// without one, or while it does not run).
	ExpiresAt    *time.Time `json:"expires_at"`
	CreatedAt    time.Time  `json:"created_at"`
	UpdatedAt    time.Time  `json:"updated_at"`
	LastActiveAt time.Time  `json:"last_active_at"`
	Error        *ErrorInfo `json:"error"`
	// ForkOf is the sandbox this one was forked from; Snapshot the
	// snapshot it was created from.
	ForkOf   string `json:"fork_of,omitempty"`
	Snapshot string `json:"snapshot,omitempty"`
	// Node is the cluster node that runs it (empty on a single machine).
	Node string `json:"node,omitempty"`
}

// Network is a sandbox's network policy: Egress ("public" or "none") for
// destinations no rule names, Allow and Deny of CIDRs, addresses or domain
// names ("pypi.org", "*.github.com"; Allow wins over Deny). The floor
// (host, metadata, private ranges, other sandboxes) wins over all of it.
// IngressToken is read-only: the X-Space-Ingress-Token that reaches the
// sandbox's ports through the data plane unless PublicIngress.
type Network struct {
	Egress        string   `json:"egress,omitempty"`
	Allow         []string `json:"allow,omitempty"`
	Deny          []string `json:"deny,omitempty"`
	PublicIngress bool     `json:"public_ingress,omitempty"`
	IngressToken  string   `json:"ingress_token,omitempty"`
}

// TemplateRef names a template as a sandbox or snapshot was made from it:
// the reference asked for and the digest it resolved to.
type TemplateRef struct {
	Ref    string `json:"ref"`
	Digest string `json:"digest"`
}

// Operation is an asynchronous lifecycle change.
type Operation struct {
	ID          string     `json:"id"`
	Project     string     `json:"project"`
	Kind        string     `json:"kind"`
	SandboxID   string     `json:"sandbox_id"`
	Sandboxes   []string   `json:"sandboxes,omitempty"` // a fork's new sandboxes
	Template    string     `json:"template,omitempty"`  // the name:tag a build makes
	Snapshot    string     `json:"snapshot,omitempty"`  // the snapshot a snapshot operation makes
	State       string     `json:"state"`
	Error       *ErrorInfo `json:"error"`
	CreatedAt   time.Time  `json:"created_at"`
	UpdatedAt   time.Time  `json:"updated_at"`
	CompletedAt *time.Time `json:"completed_at"`
}

// Done reports whether the operation reached a terminal state.
func (o *Operation) Done() bool { return o.State == "succeeded" || o.State == "failed" }

// CreateSandboxRequest asks for a sandbox; zero fields take server defaults.
type CreateSandboxRequest struct {
	Template      string            `json:"template,omitempty"`
	Runtime       string            `json:"runtime,omitempty"`
	Resources     *Resources        `json:"resources,omitempty"`
	Env           map[string]string `json:"env,omitempty"`
	Metadata      map[string]string `json:"metadata,omitempty"`
	AutoLifecycle *AutoLifecycle    `json:"auto_lifecycle,omitempty"`
	// Snapshot starts the sandbox from a ready snapshot (its template,
	// runtime, resources and environment).
	Snapshot string `json:"snapshot,omitempty"`
	// Network is its network policy (nil: the server's --default-egress).
	Network *Network `json:"network,omitempty"`
}

// CreateSandboxResponse is the answer to a create.
type CreateSandboxResponse struct {
	Sandbox   Sandbox   `json:"sandbox"`
	Operation Operation `json:"operation"`
}

// List is one page of a list.
type List[T any] struct {
	Items      []T     `json:"items"`
	NextCursor *string `json:"next_cursor"`
}

// CreateSandbox creates a sandbox; key may be "" to generate one.
func (c *Client) CreateSandbox(ctx context.Context, req CreateSandboxRequest, key string) (*CreateSandboxResponse, *Response, error) {
	var out CreateSandboxResponse
	resp, err := c.Do(ctx, http.MethodPost, "/v1/sandboxes", nil, key, req, &out)
	if err != nil {
		return nil, resp, err
	}
	return &out, resp, nil
}

// SetNetwork replaces a sandbox's network policy (new connections follow
// it at once; established ones carry on) and returns the sandbox.
func (c *Client) SetNetwork(ctx context.Context, id string, n Network, key string) (*Sandbox, error) {
	if id == "" {
		return nil, fmt.Errorf("empty sandbox id")
	}
	var out Sandbox
	if _, err := c.Do(ctx, http.MethodPut, "/v1/sandboxes/"+url.PathEscape(id)+"/network", nil, key, n, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// GetSandbox inspects a sandbox.
func (c *Client) GetSandbox(ctx context.Context, id string) (*Sandbox, error) {
	if id == "" {
		return nil, fmt.Errorf("empty sandbox id")
	}
	var out Sandbox
	_, err := c.Do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id), nil, "", nil, &out)
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// ListSandboxes returns one page of sandboxes, optionally in one state.
func (c *Client) ListSandboxes(ctx context.Context, state string, o ListOptions) (*List[Sandbox], error) {
	q := o.values()
	if state != "" {
		q.Set("state", state)
	}
	var out List[Sandbox]
	if _, err := c.Do(ctx, http.MethodGet, "/v1/sandboxes", q, "", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Lifecycle sends DELETE or one of the :pause, :suspend, :wake methods.
func (c *Client) Lifecycle(ctx context.Context, action, id, key string) (*Operation, *Response, error) {
	if id == "" {
		return nil, nil, fmt.Errorf("empty sandbox id")
	}
	method, path := http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)
	switch action {
	case "delete":
		method = http.MethodDelete
	case "pause", "suspend", "wake":
		path += ":" + action
	default:
		return nil, nil, fmt.Errorf("unknown lifecycle action %q", action)
	}
	var out struct {
		Operation Operation `json:"operation"`
	}
	resp, err := c.Do(ctx, method, path, nil, key, nil, &out)
	if err != nil {
		return nil, resp, err
	}
	return &out.Operation, resp, nil
}

// Fork asks for count copies of a running or paused sandbox: the operation
// that makes them and the new sandboxes (starting until it succeeds).
func (c *Client) Fork(ctx context.Context, id string, count int, key string) (*Operation, []Sandbox, *Response, error) {
	if id == "" {
		return nil, nil, nil, fmt.Errorf("empty sandbox id")
	}
	var out struct {
		Operation Operation `json:"operation"`
		Sandboxes []Sandbox `json:"sandboxes"`
	}
	resp, err := c.Do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+":fork", nil, key, map[string]int{"count": count}, &out)
	if err != nil {
		return nil, nil, resp, err
	}
	return &out.Operation, out.Sandboxes, resp, nil
}

// GetOperation polls an operation.
func (c *Client) GetOperation(ctx context.Context, id string) (*Operation, error) {
	return c.getOperation(ctx, id, nil)
}

// getOperation reads an operation with the query q (like wait=25s).
func (c *Client) getOperation(ctx context.Context, id string, q url.Values) (*Operation, error) {
	if id == "" {
		return nil, fmt.Errorf("empty operation id")
	}
	var out Operation
	if _, err := c.Do(ctx, http.MethodGet, "/v1/operations/"+url.PathEscape(id), q, "", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListOperations returns one page of operations, optionally of one sandbox.
func (c *Client) ListOperations(ctx context.Context, sandboxID string, o ListOptions) (*List[Operation], error) {
	q := o.values()
	if sandboxID != "" {
		q.Set("sandbox_id", sandboxID)
	}
	var out List[Operation]
	if _, err := c.Do(ctx, http.MethodGet, "/v1/operations", q, "", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// WaitOperation polls an operation until it is terminal or ctx ends.
func (c *Client) WaitOperation(ctx context.Context, id string) (*Operation, error) {
	// A long poll answers the moment the operation ends. A server from
	// before ?wait= refuses it: then poll at short, bounded intervals (most
	// operations finish in milliseconds, and a coarse interval would add up
	// to itself to every wait).
	delay := time.Millisecond
	query := url.Values{"wait": {"25s"}}
	for {
		op, err := c.getOperation(ctx, id, query)
		if query != nil && IsCode(err, "invalid_argument") {
			query = nil // a server from before ?wait=: poll
			continue
		}
		if err != nil {
			return nil, err
		}
		if op.Done() {
			return op, nil
		}
		if query != nil {
			continue // the long poll waited already
		}
		select {
		case <-ctx.Done():
			return op, ctx.Err()
		case <-time.After(delay):
		}
		if delay < 20*time.Millisecond {
			delay *= 2
		}
	}
}

// Snapshot is a saved sandbox (see the API's Snapshot).
type Snapshot struct {
	ID        string            `json:"id"`
	Project   string            `json:"project"`
	Name      string            `json:"name,omitempty"`
	SandboxID string            `json:"sandbox_id"`
	State     string            `json:"state"`
	Template  TemplateRef       `json:"template"`
	Runtime   string            `json:"runtime"`
	Resources Resources         `json:"resources"`
	Env       map[string]string `json:"env"`
	Tag       string            `json:"tag,omitempty"`
	SizeBytes int64             `json:"size_bytes"`
	// Node is the cluster node whose disk holds it (empty on a single
	// machine).
	Node        string     `json:"node,omitempty"`
	OperationID string     `json:"operation_id"`
	Error       *ErrorInfo `json:"error"`
	CreatedAt   time.Time  `json:"created_at"`
	UpdatedAt   time.Time  `json:"updated_at"`
}

// CreateSnapshot asks for a snapshot of a running or paused sandbox: the
// snapshot (creating) and the operation that saves it.
func (c *Client) CreateSnapshot(ctx context.Context, sandboxID, name, key string) (*Snapshot, *Operation, error) {
	if sandboxID == "" {
		return nil, nil, fmt.Errorf("empty sandbox id")
	}
	body := map[string]string{}
	if name != "" {
		body["name"] = name
	}
	var out struct {
		Snapshot  Snapshot  `json:"snapshot"`
		Operation Operation `json:"operation"`
	}
	if _, err := c.Do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(sandboxID)+"/snapshots", nil, key, body, &out); err != nil {
		return nil, nil, err
	}
	return &out.Snapshot, &out.Operation, nil
}

// ListSnapshots returns one page of snapshots, optionally of one sandbox.
func (c *Client) ListSnapshots(ctx context.Context, sandboxID string, o ListOptions) (*List[Snapshot], error) {
	q := o.values()
	if sandboxID != "" {
		q.Set("sandbox_id", sandboxID)
	}
	var out List[Snapshot]
	if _, err := c.Do(ctx, http.MethodGet, "/v1/snapshots", q, "", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// TagSnapshot makes template reference ref (name:tag) start sandboxes from
// a ready snapshot: creates of that template, and its warm pool, start
// from the snapshot. An empty ref removes the snapshot's tag.
func (c *Client) TagSnapshot(ctx context.Context, id, ref string) (*Snapshot, error) {
	if id == "" {
		return nil, fmt.Errorf("empty snapshot id")
	}
	var out Snapshot
	var err error
	if ref == "" {
		_, err = c.Do(ctx, http.MethodPost, "/v1/snapshots/"+url.PathEscape(id)+":untag", nil, "", nil, &out)
	} else {
		_, err = c.Do(ctx, http.MethodPost, "/v1/snapshots/"+url.PathEscape(id)+":tag", nil, "", map[string]string{"template": ref}, &out)
	}
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteSnapshot removes a snapshot and its image.
func (c *Client) DeleteSnapshot(ctx context.Context, id string) error {
	if id == "" {
		return fmt.Errorf("empty snapshot id")
	}
	_, err := c.Do(ctx, http.MethodDelete, "/v1/snapshots/"+url.PathEscape(id), nil, "", nil, nil)
	return err
}

// GetSnapshot reads one snapshot.
func (c *Client) GetSnapshot(ctx context.Context, id string) (*Snapshot, error) {
	var out Snapshot
	if _, err := c.Do(ctx, http.MethodGet, "/v1/snapshots/"+url.PathEscape(id), nil, "", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Node is a cluster node (space serve --role node).
type Node struct {
	ID           string `json:"id"`
	Name         string `json:"name"`
	State        string `json:"state"` // ready, cordoned, draining, lost
	Alive        bool   `json:"alive"`
	URL          string `json:"url"`
	DataPlaneURL string `json:"data_plane_url"`
	Capacity     struct {
		VCPUs        int      `json:"vcpus"`
		MemoryMiB    int      `json:"memory_mib"`
		DiskMiB      int      `json:"disk_mib"`
		MaxSandboxes int      `json:"max_sandboxes"`
		Runtimes     []string `json:"runtimes"`
	} `json:"capacity"`
	Labels map[string]string `json:"labels"`
	Load   struct {
		Sandboxes int `json:"sandboxes"`
		VCPUs     int `json:"vcpus"`
		MemoryMiB int `json:"memory_mib"`
	} `json:"load"`
	HeartbeatAt time.Time `json:"heartbeat_at"`
}

// ListNodes lists the cluster's nodes (none on a single machine).
func (c *Client) ListNodes(ctx context.Context) ([]Node, error) {
	var out struct {
		Nodes []Node `json:"nodes"`
	}
	if _, err := c.Do(ctx, http.MethodGet, "/v1/nodes", nil, "", nil, &out); err != nil {
		return nil, err
	}
	return out.Nodes, nil
}

// GetNode reads one cluster node.
func (c *Client) GetNode(ctx context.Context, id string) (*Node, error) {
	var out Node
	if _, err := c.Do(ctx, http.MethodGet, "/v1/nodes/"+url.PathEscape(id), nil, "", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// SetNodeState cordons, uncordons or drains a node (verb "cordon",
// "uncordon", "drain").
func (c *Client) SetNodeState(ctx context.Context, id, verb string) (*Node, error) {
	if id == "" {
		return nil, fmt.Errorf("empty node id")
	}
	var out Node
	if _, err := c.Do(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(id)+":"+verb, nil, "", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
