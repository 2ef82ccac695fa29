package client

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// Quotas bound what a project holds (0: no bound).
type Quotas struct {
	Sandboxes        int `json:"sandboxes,omitempty"`
	RunningSandboxes int `json:"running_sandboxes,omitempty"`
	VCPUs            int `json:"vcpus,omitempty"`
	MemoryMiB        int `json:"memory_mib,omitempty"`
	DiskMiB          int `json:"disk_mib,omitempty"`
	SnapshotMiB      int `json:"snapshot_mib,omitempty"`
	Templates        int `json:"templates,omitempty"`
	WarmPool         int `json:"warm_pool,omitempty"`
}

// Project is a tenant of the server.
type Project struct {
	Name      string    `json:"name"`
	Limits    Quotas    `json:"limits"`
	Quotas    Quotas    `json:"quotas"`
	Effective Quotas    `json:"effective_quotas"`
	CreatedAt time.Time `json:"created_at"`
}

// Token is an API token's record (never its value).
type Token struct {
	ID         string     `json:"id"`
	Name       string     `json:"name"`
	Project    string     `json:"project"`
	Role       string     `json:"role"`
	CreatedAt  time.Time  `json:"created_at"`
	ExpiresAt  *time.Time `json:"expires_at"`
	RevokedAt  *time.Time `json:"revoked_at"`
	RatePerSec float64    `json:"rate_per_sec,omitempty"`
	Burst      int        `json:"burst,omitempty"`
}

// TokenRequest asks for a token.
type TokenRequest struct {
	Name       string  `json:"name"`
	Project    string  `json:"project,omitempty"`
	Role       string  `json:"role,omitempty"`
	ExpiresIn  string  `json:"expires_in,omitempty"` // "30d", "12h"
	RatePerSec float64 `json:"rate_per_sec,omitempty"`
	Burst      int     `json:"burst,omitempty"`
	Format     string  `json:"format,omitempty"` // "e2b" for an E2B-shaped key
}

// AuditEntry is one change in the audit log.
type AuditEntry struct {
	At        time.Time `json:"at"`
	Project   string    `json:"project"`
	TokenID   string    `json:"token_id"`
	TokenName string    `json:"token_name"`
	Role      string    `json:"role"`
	Action    string    `json:"action"`
	Target    string    `json:"target"`
	Operation string    `json:"operation"`
	Status    int       `json:"status"`
	Outcome   string    `json:"outcome"`
	RequestID string    `json:"request_id"`
	Listener  string    `json:"listener"`
}

// CreateProject makes a project (owner), with the owner's limits.
func (c *Client) CreateProject(ctx context.Context, name string, limits Quotas) (*Project, error) {
	var out Project
	_, err := c.Do(ctx, http.MethodPost, "/v1/projects", nil, "", map[string]any{"name": name, "limits": limits}, &out)
	return &out, err
}

// ListProjects lists every project (owner).
func (c *Client) ListProjects(ctx context.Context) ([]Project, error) {
	var out List[Project]
	_, err := c.Do(ctx, http.MethodGet, "/v1/projects", nil, "", nil, &out)
	return out.Items, err
}

// GetProject reads one project.
func (c *Client) GetProject(ctx context.Context, name string) (*Project, error) {
	var out Project
	if _, err := c.Do(ctx, http.MethodGet, "/v1/projects/"+url.PathEscape(name), nil, "", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteProject removes a project; refused (failed_precondition) while it
// holds sandboxes, snapshots or tokens not revoked.
func (c *Client) DeleteProject(ctx context.Context, name string) error {
	_, err := c.Do(ctx, http.MethodDelete, "/v1/projects/"+url.PathEscape(name), nil, "", nil, nil)
	return err
}

// SetProjectQuotas sets a project's quotas (admin; within its limits),
// or its limits (owner) when limits is true.
func (c *Client) SetProjectQuotas(ctx context.Context, name string, q Quotas, limits bool) (*Project, error) {
	what := "/quotas"
	if limits {
		what = "/limits"
	}
	var out Project
	_, err := c.Do(ctx, http.MethodPut, "/v1/projects/"+url.PathEscape(name)+what, nil, "", q, &out)
	return &out, err
}

// ProjectUsage reports what a project holds and the quotas it is held to.
func (c *Client) ProjectUsage(ctx context.Context, name string) (usage, quotas Quotas, err error) {
	var out struct {
		Usage  Quotas `json:"usage"`
		Quotas Quotas `json:"quotas"`
	}
	_, err = c.Do(ctx, http.MethodGet, "/v1/projects/"+url.PathEscape(name)+"/usage", nil, "", nil, &out)
	return out.Usage, out.Quotas, err
}

// CreateToken makes a token and returns its record and its value (shown
// only in this answer).
func (c *Client) CreateToken(ctx context.Context, req TokenRequest) (*Token, string, error) {
	var out struct {
		Token Token  `json:"token"`
		Value string `json:"value"`
	}
	_, err := c.Do(ctx, http.MethodPost, "/v1/tokens", nil, "", req, &out)
	return &out.Token, out.Value, err
}

// ListTokens lists the tokens of the caller's project (an owner may name
// another).
func (c *Client) ListTokens(ctx context.Context, project string) ([]Token, error) {
	q := url.Values{}
	if project != "" {
		q.Set("project", project)
	}
	var out List[Token]
	_, err := c.Do(ctx, http.MethodGet, "/v1/tokens", q, "", nil, &out)
	return out.Items, err
}

// RevokeToken revokes a token.
func (c *Client) RevokeToken(ctx context.Context, id string) error {
	_, err := c.Do(ctx, http.MethodDelete, "/v1/tokens/"+url.PathEscape(id), nil, "", nil, nil)
	return err
}

// AuditQuery filters the audit log.
type AuditQuery struct {
	Project, TokenID, Action string
	Since                    time.Time
	ListOptions
}

// ListAudit reads one page of the audit log (admin).
func (c *Client) ListAudit(ctx context.Context, aq AuditQuery) (*List[AuditEntry], error) {
	q := aq.ListOptions.values()
	for k, v := range map[string]string{"project": aq.Project, "token_id": aq.TokenID, "action": aq.Action} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if !aq.Since.IsZero() {
		q.Set("since", aq.Since.Format(time.RFC3339Nano))
	}
	var out List[AuditEntry]
	_, err := c.Do(ctx, http.MethodGet, "/v1/audit", q, "", nil, &out)
	return &out, err
}
