// Package client is the Go client of SPACE's native control-plane API. The
// `space` CLI and the end-to-end tests use it. Every mutating call carries an
// Idempotency-Key (generated unless given) and is retried with that same key
// when the transport fails, so a retry never does anything twice.
package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Client talks to one SPACE control plane.
type Client struct {
	base  *url.URL
	token string
	http  *http.Client
	// Retries is how many times a mutating call is retried, with the same
	// Idempotency-Key, after a transport error or a 503.
	Retries int
	// SSE makes Attach ask for Server-Sent Events only, not the binary
	// stream it prefers.
	SSE bool
}

// New returns a client for the API at baseURL (for example
// http://127.0.0.1:8080) authenticating with token.
func New(baseURL, token string) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(baseURL, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("API URL %q: want http(s)://host:port", baseURL)
	}
	return &Client{base: u, token: token, Retries: 3, http: &http.Client{
		Timeout: 60 * time.Second,
		// Never follow redirects: a redirect could carry the token elsewhere.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}, nil
}

// Error is an API error response.
type Error struct {
	Status  int            `json:"-"`
	Code    string         `json:"code"`
	Message string         `json:"message"`
	Details map[string]any `json:"details,omitempty"`
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s (HTTP %d): %s", e.Code, e.Status, e.Message)
}

// IsCode reports whether err is an API error with the given code.
func IsCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// Response describes how a call was answered.
type Response struct {
	Status   int
	Replayed bool   // Idempotent-Replayed: true
	Location string // Location header
	// IdempotencyKey is the key the call was sent with.
	IdempotencyKey string
}

// NewIdempotencyKey returns a fresh random key.
func NewIdempotencyKey() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// url is path (under the client's base URL) with query q.
func (c *Client) url(path string, q url.Values) string {
	u := *c.base
	u.Path = c.base.Path + path
	u.RawQuery = q.Encode()
	return u.String()
}

// Do sends one request. body is JSON-encoded when non-nil; out receives the
// decoded JSON response. key is the Idempotency-Key ("" on a mutation makes
// one up). Non-2xx answers are returned as *Error.
func (c *Client) Do(ctx context.Context, method, path string, q url.Values, key string, body, out any) (*Response, error) {
	var payload []byte
	if body != nil {
		var err error
		if payload, err = json.Marshal(body); err != nil {
			return nil, fmt.Errorf("encode request: %w", err)
		}
	}
	mutating := method != http.MethodGet && method != http.MethodHead
	if mutating && key == "" {
		key = NewIdempotencyKey()
	}
	u := c.url(path, q)
	attempts := 1
	if mutating {
		attempts += c.Retries
	}
	var lastErr error
	for i := 0; i < attempts; i++ {
		if i > 0 {
			select {
			case <-ctx.Done():
				return nil, errors.Join(lastErr, ctx.Err())
			case <-time.After(time.Duration(100*(1<<i)) * time.Millisecond):
			}
		}
		resp, err := c.once(ctx, method, u, key, payload, out)
		if err == nil {
			return resp, nil
		}
		lastErr = err
		var apiErr *Error
		if errors.As(err, &apiErr) && apiErr.Status != http.StatusServiceUnavailable {
			return resp, err
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, lastErr
}

func (c *Client) once(ctx context.Context, method, u, key string, payload []byte, out any) (*Response, error) {
	var rd io.Reader
	if payload != nil {
		rd = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json")
	if payload != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("%s %s: read response: %w", method, req.URL.Path, err)
	}
	r := &Response{Status: resp.StatusCode, Replayed: resp.Header.Get("Idempotent-Replayed") == "true", Location: resp.Header.Get("Location"), IdempotencyKey: key}
	if resp.StatusCode >= 300 {
		return r, apiError(resp.StatusCode, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return r, fmt.Errorf("%s %s: decode response: %w", method, req.URL.Path, err)
		}
	}
	return r, nil
}

// apiError decodes an error response's envelope.
func apiError(status int, body []byte) error {
	var env struct {
		Error *Error `json:"error"`
	}
	if json.Unmarshal(body, &env) != nil || env.Error == nil {
		return &Error{Status: status, Code: "unknown", Message: strings.TrimSpace(string(body))}
	}
	env.Error.Status = status
	return env.Error
}

// ListOptions page through a list.
type ListOptions struct {
	Limit  int
	Cursor string
}

func (o ListOptions) values() url.Values {
	q := url.Values{}
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	if o.Cursor != "" {
		q.Set("cursor", o.Cursor)
	}
	return q
}
