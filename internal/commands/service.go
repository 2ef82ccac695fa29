// Package commands runs command sessions in sandboxes: it validates a
// command, registers it with the sandbox's agent (it starts on first
// attach), issues the session's attachment token, and reports and signals
// processes. Output streaming lives in the data plane (package api).
package commands

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/spacesandbox/space/internal/auth"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/sandboxio"
)

// Agents finds the agent of a running sandbox.
type Agents interface {
	// Agent returns a sandbox's agent: NotFound for an unknown sandbox,
	// FailedPrecondition (naming the state) when it is not running.
	Agent(ctx context.Context, sandboxID string) (*sandboxio.Agent, *sandbox.Sandbox, error)
	// Attached marks an open event stream on a sandbox until release: the
	// sandbox is not idle meanwhile.
	Attached(sandboxID string) (release func())
}

// Config wires a Service.
type Config struct {
	Agents Agents
	Signer *auth.Signer
	// DataPlaneURL is the data plane's public base URL (http://host:port).
	DataPlaneURL string
	// TokenTTL is how long an attachment token is valid (default 24 h).
	TokenTTL time.Duration
	Logger   *slog.Logger
}

// Service creates and inspects command sessions.
type Service struct {
	cfg Config
	log *slog.Logger
}

// New returns a Service.
func New(cfg Config) *Service {
	if cfg.TokenTTL == 0 {
		cfg.TokenTTL = 24 * time.Hour
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Service{cfg: cfg, log: cfg.Logger}
}

// Signer returns the attachment token signer.
func (s *Service) Signer() *auth.Signer { return s.cfg.Signer }

// Agents returns where agents are found.
func (s *Service) Agents() Agents { return s.cfg.Agents }

// PTYRequest asks for a terminal.
type PTYRequest struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

// CreateRequest is the body of POST /v1/sandboxes/{id}/commands.
type CreateRequest struct {
	Command []string          `json:"command"`
	Cwd     string            `json:"cwd,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Timeout string            `json:"timeout,omitempty"`
	Stdin   bool              `json:"stdin,omitempty"`
	PTY     *PTYRequest       `json:"pty"`
	// User runs the command as this user of the sandbox (name or uid); ""
	// is root. Without cwd it starts in the user's home.
	User string `json:"user,omitempty"`
	// Tag labels the process (the E2B layer's process tags).
	Tag string `json:"-"`
}

// Attach says where and how to attach to a session.
type Attach struct {
	URL       string    `json:"url"`
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Session is the answer to a create.
type Session struct {
	SessionID string `json:"session_id"`
	ProcessID string `json:"process_id"`
	Attach    Attach `json:"attach"`
}

// Process is a process as the API shows it.
type Process struct {
	ID        string     `json:"id"`
	State     string     `json:"state"` // running, exited
	Command   []string   `json:"command"`
	Cwd       string     `json:"cwd,omitempty"`
	PTY       bool       `json:"pty"`
	PID       int        `json:"pid,omitempty"`
	User      string     `json:"user,omitempty"`
	ExitCode  *int       `json:"exit_code"`
	Signal    *string    `json:"signal"`
	Error     *ErrorInfo `json:"error"`
	StartedAt *time.Time `json:"started_at"`
	ExitedAt  *time.Time `json:"exited_at"`
	CreatedAt time.Time  `json:"created_at"`
}

// ErrorInfo is why a process failed.
type ErrorInfo struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// FromAgent converts the agent's process status.
func FromAgent(p sandboxio.Process) Process {
	out := Process{ID: p.ID, State: p.State, Command: p.Argv, Cwd: p.Cwd, PTY: p.PTY, PID: p.PID, User: p.User, ExitCode: p.ExitCode,
		StartedAt: p.StartedAt, ExitedAt: p.ExitedAt, CreatedAt: p.CreatedAt}
	if p.Signal != "" {
		sig := p.Signal
		out.Signal = &sig
	}
	if p.ErrorCode != "" {
		out.Error = &ErrorInfo{Code: p.ErrorCode, Message: p.ErrorMessage}
	}
	if out.Command == nil {
		out.Command = []string{}
	}
	return out
}

var (
	envKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)
	userRE   = regexp.MustCompile(`^(?:[a-z_][a-z0-9_.\-]{0,31}\$?|[0-9]{1,10})$`)
)

// MaxTimeout bounds a command's timeout.
const MaxTimeout = 24 * time.Hour

func (r *CreateRequest) validate() (time.Duration, error) {
	bad := func(field, format string, args ...any) error {
		return errdefs.New(errdefs.InvalidArgument, "%s: %s", field, fmt.Sprintf(format, args...)).WithDetails(map[string]any{"field": field})
	}
	if len(r.Command) == 0 || r.Command[0] == "" {
		return 0, bad("command", "must be a non-empty argument array, like [\"sh\", \"-c\", \"echo hi\"]")
	}
	if len(r.Command) > 4096 {
		return 0, bad("command", "at most 4096 arguments")
	}
	size := 0
	for _, a := range r.Command {
		size += len(a)
		if strings.IndexByte(a, 0) >= 0 {
			return 0, bad("command", "arguments must not contain NUL")
		}
	}
	if size > 256<<10 {
		return 0, bad("command", "arguments total more than 256 KiB")
	}
	if r.Cwd != "" && (r.Cwd[0] != '/' || strings.IndexByte(r.Cwd, 0) >= 0 || len(r.Cwd) > 4096) {
		return 0, bad("cwd", "must be an absolute path")
	}
	if len(r.Env) > 256 {
		return 0, bad("env", "at most 256 variables")
	}
	for k, v := range r.Env {
		if !envKeyRE.MatchString(k) {
			return 0, bad("env", "invalid variable name %q", k)
		}
		if len(v) > 32768 || strings.IndexByte(v, 0) >= 0 {
			return 0, bad("env", "value of %s is longer than 32 KiB or contains NUL", k)
		}
	}
	var timeout time.Duration
	if r.Timeout != "" {
		d, err := time.ParseDuration(r.Timeout)
		if err != nil || d <= 0 || d > MaxTimeout {
			return 0, bad("timeout", "must be a duration between 1ms and 24h, like \"30s\"")
		}
		timeout = d
	}
	if r.User != "" && !userRE.MatchString(r.User) {
		return 0, bad("user", "must be a user name or uid, like \"user\" or \"1000\"")
	}
	if len(r.Tag) > 256 || strings.IndexByte(r.Tag, 0) >= 0 {
		return 0, bad("tag", "at most 256 bytes, without NUL")
	}
	if r.PTY != nil && (r.PTY.Cols == 0 || r.PTY.Rows == 0) {
		return 0, bad("pty", "cols and rows must be positive")
	}
	return timeout, nil
}

// Create registers a command session in a running sandbox. The process
// starts when a client first attaches.
func (s *Service) Create(ctx context.Context, sandboxID string, req CreateRequest) (*Session, error) {
	timeout, err := req.validate()
	if err != nil {
		return nil, err
	}
	ag, sb, err := s.cfg.Agents.Agent(ctx, sandboxID)
	if err != nil {
		return nil, err
	}
	env := map[string]string{}
	for k, v := range sb.Env {
		env[k] = v
	}
	for k, v := range req.Env {
		env[k] = v
	}
	spec := sandboxio.Spec{ID: ids.New(ids.Process), Argv: req.Command, Env: env, Cwd: req.Cwd, Timeout: timeout, Stdin: req.Stdin,
		User: req.User, Tag: req.Tag}
	if req.PTY != nil {
		spec.PTYCols, spec.PTYRows = req.PTY.Cols, req.PTY.Rows
	}
	if _, err := ag.CreateProcess(ctx, spec); err != nil {
		return nil, err
	}
	exp := time.Now().Add(s.cfg.TokenTTL).UTC().Truncate(time.Second)
	tok := s.cfg.Signer.Issue(auth.Claims{Session: spec.ID, Sandbox: sandboxID, Expires: exp.Unix(), Token: auth.TokenID(ctx), Project: auth.Project(ctx)})
	s.log.Info("command session created", "sandbox_id", sandboxID, "process_id", spec.ID)
	base := s.cfg.DataPlaneURL
	if u, ok := ctx.Value(dataPlaneKey{}).(string); ok && u != "" {
		base = u
	}
	return &Session{SessionID: spec.ID, ProcessID: spec.ID, Attach: Attach{
		URL: strings.TrimRight(base, "/") + "/v1/sessions/" + spec.ID + "/events", Token: tok, ExpiresAt: exp,
	}}, nil
}

type dataPlaneKey struct{}

// WithDataPlaneURL makes the sessions created under ctx name url as their
// data plane (a cluster's control replica that proxies the data plane).
func WithDataPlaneURL(ctx context.Context, url string) context.Context {
	return context.WithValue(ctx, dataPlaneKey{}, url)
}

// Get returns one process. A session not yet attached is NotFound.
func (s *Service) Get(ctx context.Context, sandboxID, processID string) (*Process, error) {
	ag, _, err := s.cfg.Agents.Agent(ctx, sandboxID)
	if err != nil {
		return nil, err
	}
	p, err := ag.GetProcess(ctx, processID)
	if err != nil {
		return nil, err
	}
	if p.State == sandboxio.ProcPending {
		return nil, errdefs.New(errdefs.NotFound, "process %s has not started: attach to its session to start it", processID)
	}
	out := FromAgent(p)
	return &out, nil
}

// List returns the processes running now.
func (s *Service) List(ctx context.Context, sandboxID string) ([]Process, error) {
	ag, _, err := s.cfg.Agents.Agent(ctx, sandboxID)
	if err != nil {
		return nil, err
	}
	ps, err := ag.Processes(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Process, 0, len(ps))
	for _, p := range ps {
		out = append(out, FromAgent(p))
	}
	return out, nil
}

// Signal sends a signal to a running process's group.
func (s *Service) Signal(ctx context.Context, sandboxID, processID, sig string) error {
	if sig == "" || len(sig) > 16 {
		return errdefs.New(errdefs.InvalidArgument, "signal: name a signal, like \"SIGTERM\"").WithDetails(map[string]any{"field": "signal"})
	}
	ag, _, err := s.cfg.Agents.Agent(ctx, sandboxID)
	if err != nil {
		return err
	}
	if p, err := ag.GetProcess(ctx, processID); err != nil {
		return err
	} else if p.State == sandboxio.ProcPending {
		return errdefs.New(errdefs.NotFound, "process %s has not started", processID)
	}
	return ag.Signal(ctx, processID, sig)
}
