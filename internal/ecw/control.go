package ecw

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spacesandbox/space/internal/audit"
	"github.com/spacesandbox/space/internal/auth"
	"github.com/spacesandbox/space/internal/edge"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/lifecycle"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

func (s *Server) routeControl() {
	m := s.control
	h := func(pattern string, fn handler) { m.Handle(pattern, s.handle(s.authed(fn))) }
	h("POST /sandboxes", s.create)
	h("POST /v2/sandboxes", s.create)
	h("GET /sandboxes", s.listV1)
	h("GET /v2/sandboxes", s.listV2)
	h("GET /sandboxes/{sandboxID}", s.get)
	h("DELETE /sandboxes/{sandboxID}", s.kill)
	h("POST /sandboxes/{sandboxID}/pause", s.pause)
	h("POST /sandboxes/{sandboxID}/resume", s.resume)
	h("POST /sandboxes/{sandboxID}/connect", s.connect)
	h("POST /v2/sandboxes/{sandboxID}/connect", s.connect)
	h("POST /sandboxes/{sandboxID}/fork", s.fork)
	h("POST /sandboxes/{sandboxID}/snapshots", s.createSnapshot)
	h("GET /snapshots", s.listSnapshots)
	h("DELETE /templates/{templateID}", s.deleteTemplate)
	h("POST /sandboxes/{sandboxID}/timeout", s.setTimeout)
	h("POST /sandboxes/{sandboxID}/refreshes", s.refresh)
	h("GET /sandboxes/{sandboxID}/metrics", s.metrics)
	h("PUT /sandboxes/{sandboxID}/network", s.updateNetwork)
	m.Handle("GET /health", s.handle(func(w http.ResponseWriter, r *http.Request) error {
		return edge.JSON(w, http.StatusOK, map[string]string{"status": "ok"})
	}))
}

// authed checks the API key: X-API-KEY as the SDKs send it, or a bearer
// token. The keys are SPACE API tokens.
func (s *Server) authed(next handler) handler {
	return func(w http.ResponseWriter, r *http.Request) error {
		key := r.Header.Get("X-API-KEY")
		if key == "" {
			key, _ = auth.BearerToken(r.Header.Get("Authorization"))
		}
		t, err := s.cfg.Tokens.Verify(r.Context(), key)
		if err != nil {
			return err
		}
		if wait, err := s.cfg.Limiter.Allow(t); err != nil {
			w.Header().Set("Retry-After", strconv.Itoa(int(wait.Seconds())))
			return err
		}
		if rec := audit.From(r.Context()); rec != nil {
			rec.Token = t
		}
		// A key is a project's token: a read-only one lists and reads.
		if r.Method != http.MethodGet && t.Role.Rank() < store.RoleMember.Rank() {
			return errdefs.New(errdefs.PermissionDenied, "this API key is read-only")
		}
		return next(w, r.WithContext(auth.WithToken(r.Context(), t)))
	}
}

// newSandbox is the body of a create. Fields SPACE cannot honour are
// accepted when unset and refused when set, never silently dropped.
type newSandbox struct {
	TemplateID          string                  `json:"templateID"`
	Timeout             *int                    `json:"timeout"` // seconds
	AutoPause           *bool                   `json:"autoPause"`
	AutoPauseMemory     *bool                   `json:"autoPauseMemory"`
	AutoResume          *struct{ Enabled bool } `json:"autoResume"`
	Secure              *bool                   `json:"secure"`
	AllowInternetAccess *bool                   `json:"allow_internet_access"`
	Metadata            map[string]string       `json:"metadata"`
	EnvVars             map[string]string       `json:"envVars"`
	Network             *networkBody            `json:"network"`
	MCP                 any                     `json:"mcp"`
	IAM                 any                     `json:"iam"`
	VolumeMounts        []any                   `json:"volumeMounts"`
}

// sandboxInfo is E2B's Sandbox (create, connect, resume).
type sandboxInfo struct {
	TemplateID         string  `json:"templateID"`
	SandboxID          string  `json:"sandboxID"`
	Alias              *string `json:"alias,omitempty"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    *string `json:"envdAccessToken"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// sandboxDetail is E2B's SandboxDetail and ListedSandbox.
type sandboxDetail struct {
	TemplateID      string            `json:"templateID"`
	Alias           *string           `json:"alias,omitempty"`
	SandboxID       string            `json:"sandboxID"`
	ClientID        string            `json:"clientID"`
	StartedAt       time.Time         `json:"startedAt"`
	EndAt           time.Time         `json:"endAt"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken *string           `json:"envdAccessToken,omitempty"`
	Domain          *string           `json:"domain"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int               `json:"memoryMB"`
	DiskSizeMB      int               `json:"diskSizeMB"`
	Metadata        map[string]string `json:"metadata"`
	State           string            `json:"state"`
	Lifecycle       lifecycleInfo     `json:"lifecycle"`
	VolumeMounts    []any             `json:"volumeMounts"`
	Network         *networkInfo      `json:"network,omitempty"`
	// AllowInternetAccess is whether egress is public.
	AllowInternetAccess *bool `json:"allowInternetAccess,omitempty"`
}

type lifecycleInfo struct {
	OnTimeout  string `json:"onTimeout"` // kill or pause
	AutoResume bool   `json:"autoResume"`
}

const clientID = "space"

// e2bState is how E2B sees a SPACE state: suspended (and the in-memory pause)
// is "paused"; a sandbox on its way somewhere is where it is going.
func e2bState(st sandbox.State) string {
	switch st {
	case sandbox.Running, sandbox.Starting, sandbox.Resuming, sandbox.Restoring:
		return "running"
	case sandbox.Paused, sandbox.Pausing, sandbox.Suspended, sandbox.Suspending:
		return "paused"
	}
	return string(st)
}

// info is a created or connected sandbox; its envd access token belongs to
// the API token of the request (tokenID).
func (s *Server) info(sb *sandbox.Sandbox, tokenID string) sandboxInfo {
	tok := s.cfg.Commands.Signer().SandboxAccessToken(sb.ID, tokenID)
	info := sandboxInfo{TemplateID: sb.Template.Ref, SandboxID: sb.ID, ClientID: clientID, EnvdVersion: EnvdVersion, EnvdAccessToken: &tok}
	if sb.Network != nil {
		traffic := s.cfg.Commands.Signer().IngressToken(sb.ID)
		info.TrafficAccessToken = &traffic
	}
	if s.cfg.Domain != "" {
		info.Domain = &s.cfg.Domain
	}
	return info
}

// detail describes a sandbox, with an envd access token for the API token
// tokenID unless that is "" (lists carry none).
func (s *Server) detail(sb *sandbox.Sandbox, tokenID string) sandboxDetail {
	d := sandboxDetail{
		TemplateID: sb.Template.Ref, SandboxID: sb.ID, ClientID: clientID, StartedAt: sb.CreatedAt, EndAt: sb.UpdatedAt,
		EnvdVersion: EnvdVersion, CPUCount: sb.Resources.VCPUs, MemoryMB: sb.Resources.MemoryMiB, DiskSizeMB: sb.Resources.DiskMiB,
		Metadata: sb.Metadata, State: e2bState(sb.State), VolumeMounts: []any{},
		Lifecycle: lifecycleInfo{OnTimeout: "kill"},
	}
	if sb.ExpiresAt != nil {
		d.EndAt = *sb.ExpiresAt
	}
	if sb.AutoLifecycle.TimeoutAction == "suspend" {
		d.Lifecycle.OnTimeout = "pause"
	}
	if d.Metadata == nil {
		d.Metadata = map[string]string{}
	}
	if tokenID != "" {
		tok := s.cfg.Commands.Signer().SandboxAccessToken(sb.ID, tokenID)
		d.EnvdAccessToken = &tok
	}
	if s.cfg.Domain != "" {
		d.Domain = &s.cfg.Domain
	}
	d.Network, d.AllowInternetAccess = s.infoNetwork(sb)
	return d
}

// templateRef maps an E2B template id to a SPACE template: "base" (the
// SDKs' default) is the server's default template.
func templateRef(id string) string {
	if id == "" || id == "base" {
		return lifecycle.DefaultTemplate
	}
	return id
}

func timeoutOf(seconds *int, def time.Duration) (time.Duration, error) {
	if seconds == nil {
		return def, nil
	}
	if *seconds < 1 || time.Duration(*seconds)*time.Second > lifecycle.MaxTimeout {
		return 0, errdefs.New(errdefs.InvalidArgument, "timeout must be between 1 and %d seconds", int(lifecycle.MaxTimeout/time.Second))
	}
	return time.Duration(*seconds) * time.Second, nil
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) error {
	var req newSandbox
	if err := decodeBody(w, r, &req); err != nil {
		return err
	}
	unsupported := func(field string) error {
		return errdefs.New(errdefs.InvalidArgument, "%s is not supported by SPACE", field)
	}
	switch {
	case req.MCP != nil:
		return unsupported("mcp")
	case req.IAM != nil:
		return unsupported("iam")
	case len(req.VolumeMounts) > 0:
		return unsupported("volumeMounts")
	case req.AutoResume != nil && req.AutoResume.Enabled:
		return unsupported("autoResume")
	case req.AutoPauseMemory != nil && !*req.AutoPauseMemory:
		return unsupported("autoPauseMemory: false (a suspend always keeps memory)")
	}
	timeout, err := timeoutOf(req.Timeout, DefaultTimeout)
	if err != nil {
		return err
	}
	action := "delete"
	if req.AutoPause != nil && *req.AutoPause {
		action = "suspend"
	}
	netPolicy, err := createNetwork(req.AllowInternetAccess, req.Network)
	if err != nil {
		return err
	}
	creq := lifecycle.CreateRequest{
		Template: templateRef(req.TemplateID), Env: req.EnvVars, Metadata: req.Metadata,
		AutoLifecycle: &sandbox.AutoLifecycle{Timeout: timeout.String(), TimeoutAction: action},
		Network:       netPolicy,
	}
	// Sandbox.create(snapshotId): a snapshot's id as the template starts
	// from the snapshot ("<id>:default", E2B's tag, is accepted).
	if id, _, _ := strings.Cut(req.TemplateID, ":"); strings.HasPrefix(id, string(ids.Snapshot)) {
		creq.Snapshot, creq.Template = id, ""
		if len(creq.Env) == 0 {
			creq.Env = nil
		}
	}
	creq.Project = auth.Project(r.Context())
	sb, op, err := s.cfg.Engine.Create(r.Context(), creq, nil)
	if err != nil {
		return err
	}
	if err := s.await(r.Context(), op); err != nil {
		return err
	}
	s.log.Info("E2B sandbox created", "sandbox_id", sb.ID, "operation_id", op.ID)
	return edge.JSON(w, http.StatusCreated, s.info(sb, auth.TokenID(r.Context())))
}

// await waits for an operation and turns its failure into an error.
func (s *Server) await(ctx context.Context, op *sandbox.Operation) error {
	if op.State.Terminal() {
		return opError(op)
	}
	done, err := s.cfg.Engine.WaitOperation(ctx, op.ID)
	if err != nil {
		return errdefs.Wrap(errdefs.Unavailable, err, "operation %s did not finish while the request waited; it goes on", op.ID)
	}
	return opError(done)
}

func opError(op *sandbox.Operation) error {
	if op.State == sandbox.OpSucceeded {
		return nil
	}
	if op.Error == nil {
		return errdefs.New(errdefs.Internal, "%s failed", op.Kind)
	}
	return errdefs.New(errdefs.Internal, "%s failed: %s", op.Kind, op.Error.Message)
}

// sandbox loads the sandbox a path names, as E2B's API reads the id: an
// optional "-clientID" suffix is dropped; an id E2B would refuse to parse
// (more than one "-", or anything but lower-case letters and digits — a
// SPACE id's "sbx_" aside) is 400 "Invalid sandbox ID"; an unknown, pooled
// or deleted one is 404 with E2B's message.
func (s *Server) sandbox(r *http.Request) (*sandbox.Sandbox, error) {
	id, ok := shortID(r.PathValue("sandboxID"))
	if !ok {
		return nil, errdefs.New(errdefs.InvalidArgument, "Invalid sandbox ID")
	}
	if !ids.Valid(ids.Sandbox, id) {
		return nil, sandboxNotFound(id)
	}
	sb, err := s.cfg.Engine.Get(r.Context(), id)
	if errors.Is(err, errdefs.NotFound) {
		return nil, sandboxNotFound(id)
	}
	if err != nil {
		return nil, err
	}
	if sb.State == sandbox.Deleted || sb.State == sandbox.Deleting || sb.Pool != "" || sb.Project != auth.Project(r.Context()) {
		return nil, sandboxNotFound(id)
	}
	return sb, nil
}

// shortID is E2B's reading of a sandbox id in a path: "<id>" or
// "<id>-<clientID>", the id lower-case letters and digits ("sbx_" allowed
// as SPACE's prefix).
func shortID(composite string) (string, bool) {
	parts := strings.Split(composite, "-")
	if len(parts) > 2 {
		return "", false
	}
	id := parts[0]
	body := strings.TrimPrefix(id, string(ids.Sandbox))
	if body == "" {
		return "", false
	}
	for _, c := range body {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return "", false
		}
	}
	return id, true
}

// sandboxNotFound is E2B's 404 for a sandbox.
func sandboxNotFound(id string) error {
	return errdefs.New(errdefs.NotFound, "Sandbox %q doesn't exist or you don't have access to it", id)
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	return edge.JSON(w, http.StatusOK, s.detail(sb, auth.TokenID(r.Context())))
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	op, err := s.cfg.Engine.Delete(r.Context(), sb.ID, nil)
	if err != nil {
		return err
	}
	if err := s.await(r.Context(), op); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// pause is E2B's pause: a SPACE suspend. Pausing a paused sandbox is 409.
func (s *Server) pause(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Memory *bool `json:"memory"`
	}
	if err := decodeBody(w, r, &body); err != nil {
		return err
	}
	if body.Memory != nil && !*body.Memory {
		return errdefs.New(errdefs.InvalidArgument, "memory: false is not supported by SPACE: a suspend always keeps memory")
	}
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	if sb.State == sandbox.Suspended || sb.State == sandbox.Suspending {
		return errdefs.New(errdefs.Conflict, "Error pausing sandbox - sandbox '%s' is already paused", sb.ID)
	}
	op, err := s.cfg.Engine.Suspend(r.Context(), sb.ID, nil)
	if err != nil {
		return conflict(err)
	}
	if err := s.await(r.Context(), op); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// conflict reports a refused transition as E2B does: 409.
func conflict(err error) error {
	if errors.Is(err, errdefs.FailedPrecondition) {
		_, msg, _ := errdefs.Public(err)
		return errdefs.Wrap(errdefs.Conflict, err, "%s", msg)
	}
	return err
}

type resumeBody struct {
	Timeout   *int  `json:"timeout"`
	AutoPause *bool `json:"autoPause"`
}

// resume (deprecated in E2B) restores a paused sandbox; a running one is 409.
func (s *Server) resume(w http.ResponseWriter, r *http.Request) error {
	var body resumeBody
	if err := decodeBody(w, r, &body); err != nil {
		return err
	}
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	if e2bState(sb.State) == "running" {
		return errdefs.New(errdefs.Conflict, "Sandbox %s is already running", sb.ID)
	}
	return s.wake(w, r, sb, body.Timeout)
}

// connect returns a running sandbox (200) or restores a paused one (201);
// either way its timeout is extended, never shortened.
func (s *Server) connect(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Timeout *int  `json:"timeout"`
		Memory  *bool `json:"memory"`
	}
	if err := decodeBody(w, r, &body); err != nil {
		return err
	}
	if body.Memory != nil && !*body.Memory {
		return errdefs.New(errdefs.InvalidArgument, "memory: false (reboot) is not supported by SPACE")
	}
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	if sb.State == sandbox.Running {
		d, err := timeoutOf(body.Timeout, 0)
		if err != nil {
			return err
		}
		if d > 0 {
			if _, err := s.cfg.Engine.ExtendTimeout(r.Context(), sb.ID, d); err != nil {
				return err
			}
		}
		s.cfg.Engine.Touch(sb.ID)
		return edge.JSON(w, http.StatusOK, s.info(sb, auth.TokenID(r.Context())))
	}
	return s.wake(w, r, sb, body.Timeout)
}

// wake restores sb, waits, and gives it its timeout from now.
func (s *Server) wake(w http.ResponseWriter, r *http.Request, sb *sandbox.Sandbox, seconds *int) error {
	d, err := timeoutOf(seconds, 0)
	if err != nil {
		return err
	}
	ctx := r.Context()
	// A transition in flight (a suspend, a create) is waited for first.
	for i := 0; sb.ActiveOperation != "" && i < 3; i++ {
		if _, err := s.cfg.Engine.WaitOperation(ctx, sb.ActiveOperation); err != nil {
			return errdefs.Wrap(errdefs.Unavailable, err, "sandbox %s is busy", sb.ID)
		}
		if sb, err = s.cfg.Engine.Get(ctx, sb.ID); err != nil {
			return err
		}
	}
	op, err := s.cfg.Engine.Wake(ctx, sb.ID, nil)
	if err != nil {
		return conflict(err)
	}
	if err := s.await(ctx, op); err != nil {
		return err
	}
	if d > 0 {
		if _, err := s.cfg.Engine.SetTimeout(ctx, sb.ID, d); err != nil {
			return err
		}
	}
	s.log.Info("E2B sandbox resumed", "sandbox_id", sb.ID, "operation_id", op.ID)
	return edge.JSON(w, http.StatusCreated, s.info(sb, auth.TokenID(r.Context())))
}

// forkResult is one entry of E2B's fork answer: the sandbox or the error.
type forkResult struct {
	Sandbox *sandboxInfo `json:"sandbox,omitempty"`
	Error   *apiError    `json:"error,omitempty"`
}

// fork is E2B's fork: count copies of a running sandbox, each with its own
// timeout (E2B's default: 15 s), answered once they run. SPACE starts all
// copies or none, so the entries all succeed or all carry the same error.
func (s *Server) fork(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Timeout *int `json:"timeout"`
		Count   *int `json:"count"`
	}
	if err := decodeBody(w, r, &body); err != nil {
		return err
	}
	count := 1
	if body.Count != nil {
		count = *body.Count
	}
	if count < 1 || count > sandbox.MaxForks {
		return errdefs.New(errdefs.InvalidArgument, "count must be between 1 and %d", sandbox.MaxForks)
	}
	timeout, err := timeoutOf(body.Timeout, 15*time.Second)
	if err != nil {
		return err
	}
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	if e2bState(sb.State) != "running" {
		return errdefs.New(errdefs.Conflict, "Sandbox %q is in %s state", sb.ID, e2bState(sb.State))
	}
	op, forks, err := s.cfg.Engine.Fork(r.Context(), sb.ID, count, nil)
	if err != nil {
		return conflict(err)
	}
	opErr := s.await(r.Context(), op)
	if opErr != nil && errors.Is(opErr, errdefs.Unavailable) {
		return opErr // still going: the client may look for the forks later
	}
	out := make([]forkResult, 0, len(forks))
	tokenID := auth.TokenID(r.Context())
	for _, f := range forks {
		if opErr == nil {
			_, opErr = s.cfg.Engine.SetTimeout(r.Context(), f.ID, timeout)
		}
		if opErr == nil {
			info := s.info(f, tokenID)
			out = append(out, forkResult{Sandbox: &info})
			continue
		}
		status, msg, _ := errdefs.Public(opErr)
		out = append(out, forkResult{Error: &apiError{Code: status.Status, Message: msg}})
	}
	s.log.Info("E2B sandbox forked", "sandbox_id", sb.ID, "operation_id", op.ID, "count", count)
	return edge.JSON(w, http.StatusCreated, out)
}

// setTimeout replaces the sandbox's timeout (E2B: POST …/timeout).
func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) error {
	return s.changeTimeout(w, r, "timeout", 0, s.cfg.Engine.SetTimeout)
}

// refresh extends a sandbox's timeout by duration seconds (default 60).
func (s *Server) refresh(w http.ResponseWriter, r *http.Request) error {
	return s.changeTimeout(w, r, "duration", time.Minute, s.cfg.Engine.ExtendTimeout)
}

// changeTimeout reads {field: seconds} (required when def is 0) and applies
// it to the sandbox the path names.
func (s *Server) changeTimeout(w http.ResponseWriter, r *http.Request, field string, def time.Duration,
	apply func(ctx context.Context, id string, d time.Duration) (*sandbox.Sandbox, error)) error {
	var body map[string]*int
	err := decodeBody(w, r, &body)
	if err == nil {
		for k := range body {
			if k != field {
				err = errdefs.New(errdefs.InvalidArgument, "invalid JSON body: unknown field %q", k)
			}
		}
	}
	if err == nil && body[field] == nil && def == 0 {
		err = errdefs.New(errdefs.InvalidArgument, "%s (seconds) is required", field)
	}
	var d time.Duration
	if err == nil {
		d, err = timeoutOf(body[field], def)
	}
	var sb *sandbox.Sandbox
	if err == nil {
		sb, err = s.sandbox(r)
	}
	// E2B keeps timeouts for running sandboxes only: a paused one is not
	// found there.
	if err == nil && e2bState(sb.State) != "running" {
		err = sandboxNotFound(sb.ID)
	}
	if err == nil {
		_, err = apply(r.Context(), sb.ID, d)
	}
	if err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// sandboxMetric is one of E2B's metrics samples.
type sandboxMetric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       uint64    `json:"memUsed"`
	MemTotal      uint64    `json:"memTotal"`
	MemCache      uint64    `json:"memCache"`
	DiskUsed      uint64    `json:"diskUsed"`
	DiskTotal     uint64    `json:"diskTotal"`
}

// metrics is a sandbox's sampled CPU, memory and disk use, oldest first,
// between ?start= and ?end= (Unix seconds) when given.
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) error {
	var bounds [2]time.Time
	for i, k := range []string{"start", "end"} {
		if v := r.URL.Query().Get(k); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return errdefs.New(errdefs.InvalidArgument, "%s must be a Unix time in seconds", k)
			}
			bounds[i] = time.Unix(n, 0)
		}
	}
	if !bounds[1].IsZero() {
		bounds[1] = bounds[1].Add(time.Second - 1) // the whole second
	}
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	out := []sandboxMetric{}
	if s.cfg.Usage != nil {
		for _, x := range s.cfg.Usage.Series(sb.ID, bounds[0], bounds[1]) {
			out = append(out, sandboxMetric{Timestamp: x.At, TimestampUnix: x.At.Unix(), CPUCount: x.CPUCount, CPUUsedPct: x.CPUUsedPct,
				MemUsed: x.MemUsed, MemTotal: x.MemTotal, MemCache: x.MemCache, DiskUsed: x.DiskUsed, DiskTotal: x.DiskTotal})
		}
	}
	return edge.JSON(w, http.StatusOK, out)
}

// listQuery is a parsed list request.
type listQuery struct {
	states        map[string]bool // E2B states wanted
	metadata      map[string]string
	template      string
	after, before time.Time // started at or after, before (zero: no bound)
	desc          bool      // newest first (E2B's default)
	limit         int
	cursor        *listCursor // the last item of the previous page
}

// listCursor is where a page ends: the start time and id of its last
// sandbox. The next page starts after it in the list's order, so paging
// returns each sandbox once however the set changes meanwhile.
type listCursor struct {
	started time.Time
	id      string
}

func (c listCursor) token() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(c.started.UnixNano(), 10) + "." + c.id))
}

func parseCursor(tok string) (*listCursor, error) {
	bad := errdefs.New(errdefs.InvalidArgument, "nextToken is not a token this server gave out")
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return nil, bad
	}
	ns, id, ok := strings.Cut(string(b), ".")
	n, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil || !ids.Valid(ids.Sandbox, id) {
		return nil, bad
	}
	return &listCursor{started: time.Unix(0, n).UTC(), id: id}, nil
}

func parseList(r *http.Request, v2 bool) (listQuery, error) {
	q := listQuery{states: map[string]bool{"running": true}, limit: 100, desc: true}
	if v2 {
		q.states["paused"] = true
	}
	vals := r.URL.Query()
	allowed := map[string]bool{"metadata": true, "state": v2, "limit": v2, "nextToken": v2, "template": v2, "order": v2,
		"startedAfter": v2, "startedBefore": v2}
	for k := range vals {
		if !allowed[k] {
			return q, errdefs.New(errdefs.InvalidArgument, "unknown query parameter %q", k)
		}
	}
	// state=running&state=paused (as the SDKs send an array) or running,paused.
	if sts := vals["state"]; len(sts) > 0 {
		q.states = map[string]bool{}
		for _, x := range strings.Split(strings.Join(sts, ","), ",") {
			if x != "running" && x != "paused" {
				return q, errdefs.New(errdefs.InvalidArgument, "state must be running, paused or both")
			}
			q.states[x] = true
		}
	}
	if m := vals.Get("metadata"); m != "" {
		mv, err := url.ParseQuery(m)
		if err != nil {
			return q, errdefs.New(errdefs.InvalidArgument, "metadata must be URL-encoded key=value pairs")
		}
		q.metadata = map[string]string{}
		for k, v := range mv {
			q.metadata[k] = v[0]
		}
	}
	if l := vals.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 100 {
			return q, errdefs.New(errdefs.InvalidArgument, "limit must be between 1 and 100")
		}
		q.limit = n
	}
	switch vals.Get("order") {
	case "", "desc":
	case "asc":
		q.desc = false
	default:
		return q, errdefs.New(errdefs.InvalidArgument, "order must be asc or desc")
	}
	for name, dst := range map[string]*time.Time{"startedAfter": &q.after, "startedBefore": &q.before} {
		if v := vals.Get(name); v != "" {
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				return q, errdefs.New(errdefs.InvalidArgument, "%s must be an RFC 3339 time, like 2026-01-02T03:04:05Z", name)
			}
			*dst = t
		}
	}
	if tok := vals.Get("nextToken"); tok != "" {
		c, err := parseCursor(tok)
		if err != nil {
			return q, err
		}
		q.cursor = c
	}
	q.template = vals.Get("template")
	return q, nil
}

func (q listQuery) match(sb *sandbox.Sandbox) bool {
	if !q.states[e2bState(sb.State)] {
		return false
	}
	if q.template != "" && sb.Template.Ref != templateRef(q.template) && sb.Template.Ref != templateRef(q.template)+":latest" {
		return false
	}
	if (!q.after.IsZero() && sb.CreatedAt.Before(q.after)) || (!q.before.IsZero() && !sb.CreatedAt.Before(q.before)) {
		return false
	}
	for k, v := range q.metadata {
		if sb.Metadata[k] != v {
			return false
		}
	}
	return true
}

// maxListed bounds how many sandboxes one list request considers.
const maxListed = 10000

// list filters every sandbox by q, sorts the matches by start time (and id)
// in q's order, and returns the page after q's cursor and the token of the
// next page ("" at the end): the limit applies after the filters, so a page
// is never empty while more match.
func (s *Server) list(ctx context.Context, q listQuery) ([]sandboxDetail, string, error) {
	var all []sandbox.Sandbox
	for cursor := ""; len(all) < maxListed; {
		page, err := s.cfg.Engine.List(ctx, store.SandboxQuery{Project: auth.Project(ctx), Cursor: cursor, Limit: store.MaxLimit})
		if err != nil {
			return nil, "", err
		}
		for i := range page.Items {
			if q.match(&page.Items[i]) {
				all = append(all, page.Items[i])
			}
		}
		if cursor = page.Next; cursor == "" {
			break
		}
	}
	before := func(a, b listCursor) bool { // a comes first in the list's order
		if !a.started.Equal(b.started) {
			return a.started.Before(b.started) != q.desc
		}
		return a.id != b.id && (a.id < b.id) != q.desc
	}
	at := func(sb *sandbox.Sandbox) listCursor { return listCursor{started: sb.CreatedAt, id: sb.ID} }
	sort.Slice(all, func(i, j int) bool { return before(at(&all[i]), at(&all[j])) })
	start := 0
	if q.cursor != nil {
		start = sort.Search(len(all), func(i int) bool { return before(*q.cursor, at(&all[i])) })
	}
	end := min(start+q.limit, len(all))
	out := make([]sandboxDetail, 0, end-start)
	for i := start; i < end; i++ {
		out = append(out, s.detail(&all[i], ""))
	}
	next := ""
	if end < len(all) {
		next = at(&all[end-1]).token()
	}
	return out, next, nil
}

func (s *Server) listV2(w http.ResponseWriter, r *http.Request) error {
	q, err := parseList(r, true)
	if err != nil {
		return err
	}
	items, next, err := s.list(r.Context(), q)
	if err != nil {
		return err
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	return edge.JSON(w, http.StatusOK, items)
}

// listV1 lists every running sandbox, oldest first (E2B's v1 list has no
// paging).
func (s *Server) listV1(w http.ResponseWriter, r *http.Request) error {
	q, err := parseList(r, false)
	if err != nil {
		return err
	}
	q.limit, q.desc = maxListed, false
	items, _, err := s.list(r.Context(), q)
	if err != nil {
		return err
	}
	return edge.JSON(w, http.StatusOK, items)
}
