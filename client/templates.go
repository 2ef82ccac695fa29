package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// Template is a template the server can start sandboxes from.
type Template struct {
	Name      string            `json:"name"`
	Tag       string            `json:"tag"`
	Digest    string            `json:"digest"`
	CreatedAt time.Time         `json:"created_at"`
	SizeBytes int64             `json:"size_bytes"`
	Source    string            `json:"source"`
	Env       map[string]string `json:"env,omitempty"`
	Workdir   string            `json:"workdir,omitempty"`
}

// Ref is the template's name:tag.
func (t Template) Ref() string { return t.Name + ":" + t.Tag }

// ListTemplates lists the templates the token's project may use.
func (c *Client) ListTemplates(ctx context.Context) ([]Template, error) {
	var out struct {
		Items []Template `json:"items"`
	}
	if _, err := c.Do(ctx, http.MethodGet, "/v1/templates", nil, "", nil, &out); err != nil {
		return nil, err
	}
	return out.Items, nil
}

// GetTemplate reads one template by name:tag (the digest the tag resolves
// to now).
func (c *Client) GetTemplate(ctx context.Context, ref string) (*Template, error) {
	var t Template
	if _, err := c.Do(ctx, http.MethodGet, "/v1/templates/"+url.PathEscape(ref), nil, "", nil, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// TemplateSpec builds a template from another: packages installed, files
// placed, environment and working directory set.
type TemplateSpec struct {
	Name     string            `json:"name"`
	Tag      string            `json:"tag,omitempty"` // default "latest"
	Base     string            `json:"base"`          // name:tag
	Packages []string          `json:"packages,omitempty"`
	Files    []TemplateFile    `json:"files,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	Workdir  string            `json:"workdir,omitempty"`
}

// TemplateFile is a file placed into a template.
type TemplateFile struct {
	Path    string `json:"path"`
	Content []byte `json:"content"` // sent as base64
	Mode    string `json:"mode,omitempty"`
}

// BuildTemplate starts building a template (an admin token); the
// operation (kind "build") ends when it is ready.
func (c *Client) BuildTemplate(ctx context.Context, spec TemplateSpec, key string) (*Operation, error) {
	var out struct {
		Operation Operation `json:"operation"`
	}
	if _, err := c.Do(ctx, http.MethodPost, "/v1/templates", nil, key, spec, &out); err != nil {
		return nil, err
	}
	return &out.Operation, nil
}

// ImportTemplate uploads an OCI image archive (a tar, as `docker save` or
// `skopeo copy … oci-archive:` write) as template name:tag (an admin
// token); the operation (kind "build") ends when it is ready.
func (c *Client) ImportTemplate(ctx context.Context, name, tag string, archive io.Reader) (*Operation, error) {
	resp, err := c.rawRequest(ctx, http.MethodPost, c.url("/v1/templates", url.Values{"name": {name}, "tag": {tag}}), "application/x-tar", archive)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out struct {
		Operation Operation `json:"operation"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("decode the import's answer: %w", err)
	}
	return &out.Operation, nil
}

// WarmPool is the project's pool of ready sandboxes of one template.
type WarmPool struct {
	Template string `json:"template"`
	MinReady int    `json:"min_ready"`
	Ready    int    `json:"ready"`
	Starting int    `json:"starting"`
}

// GetWarmPool reads the project's pool of template (name:tag).
func (c *Client) GetWarmPool(ctx context.Context, template string) (*WarmPool, error) {
	var wp WarmPool
	if _, err := c.Do(ctx, http.MethodGet, "/v1/warm-pools/"+url.PathEscape(template), nil, "", nil, &wp); err != nil {
		return nil, err
	}
	return &wp, nil
}

// SetWarmPool keeps minReady sandboxes of template ready for creates (0
// empties the pool). It needs an admin token.
func (c *Client) SetWarmPool(ctx context.Context, template string, minReady int) (*WarmPool, error) {
	var wp WarmPool
	if _, err := c.Do(ctx, http.MethodPut, "/v1/warm-pools/"+url.PathEscape(template), nil, "", map[string]int{"min_ready": minReady}, &wp); err != nil {
		return nil, err
	}
	return &wp, nil
}

// MetricSample is one sample of a sandbox's use of CPU, memory and disk,
// as its own kernel accounts them.
type MetricSample struct {
	At         time.Time `json:"timestamp"`
	CPUCount   int       `json:"cpu_count"`
	CPUUsedPct float64   `json:"cpu_used_pct"` // busy share of all CPUs since the sample before, 0–100
	MemTotal   uint64    `json:"mem_total"`
	MemUsed    uint64    `json:"mem_used"`
	MemCache   uint64    `json:"mem_cache"`
	DiskTotal  uint64    `json:"disk_total"`
	DiskUsed   uint64    `json:"disk_used"`
	AgentRSS   uint64    `json:"agent_rss"` // SPACE's agent's own share of MemUsed
}

// SandboxMetrics returns the samples the server kept of a sandbox between
// start and end (zero times: no bound), oldest first.
func (c *Client) SandboxMetrics(ctx context.Context, sandboxID string, start, end time.Time) ([]MetricSample, error) {
	q := url.Values{}
	if !start.IsZero() {
		q.Set("start", start.UTC().Format(time.RFC3339))
	}
	if !end.IsZero() {
		q.Set("end", end.UTC().Format(time.RFC3339))
	}
	var out struct {
		Items []MetricSample `json:"items"`
	}
	if _, err := c.Do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(sandboxID)+"/metrics", q, "", nil, &out); err != nil {
		return nil, err
	}
	return out.Items, nil
}
