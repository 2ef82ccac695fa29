package ecw

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"

	"connectrpc.com/connect"

	"github.com/spacesandbox/space/internal/ecw/gen/filesystem/filesystemconnect"
	"github.com/spacesandbox/space/internal/ecw/gen/process/processconnect"
	"github.com/spacesandbox/space/internal/edge"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/sandboxio"
	"github.com/spacesandbox/space/internal/store"
)

// DefaultUser is the user envd requests act as when they name none (E2B's).
const DefaultUser = "user"

// MaxFileSize bounds one uploaded file.
const MaxFileSize int64 = 16 << 30

// fileChunk is how much of a file travels per agent call.
const fileChunk = 1 << 20

// MaxMessage bounds one Connect request message.
const MaxMessage = 16 << 20

func (s *Server) routeEnvd() {
	m := s.envd
	m.Handle("GET /health", s.handle(s.inSandbox(false, func(w http.ResponseWriter, r *http.Request, sc *sandboxCtx) error {
		w.WriteHeader(http.StatusNoContent)
		return nil
	})))
	m.Handle("GET /files", s.handle(s.inSandbox(true, s.download)))
	m.Handle("POST /files", s.handle(s.inSandbox(true, s.upload)))
	s.mountRPC(m, func(h http.Handler) http.Handler {
		return s.handle(s.inSandbox(true, func(w http.ResponseWriter, r *http.Request, _ *sandboxCtx) error {
			h.ServeHTTP(w, r)
			return nil
		}))
	})
}

// mountRPC mounts envd's Connect services on m, each behind wrap.
func (s *Server) mountRPC(m *http.ServeMux, wrap func(http.Handler) http.Handler) {
	opts := []connect.HandlerOption{connect.WithReadMaxBytes(MaxMessage), connect.WithInterceptors(errorInterceptor{log: s.log})}
	p, h := processconnect.NewProcessHandler(&processService{s: s}, opts...)
	m.Handle(p, wrap(h))
	p, h = filesystemconnect.NewFilesystemHandler(&filesystemService{s: s}, opts...)
	m.Handle(p, wrap(h))
}

// sandboxCtx is the sandbox an envd request acts in.
type sandboxCtx struct {
	sb    *sandbox.Sandbox
	agent *sandboxio.Agent
	user  string // from ?username= or Authorization: Basic
}

type sandboxCtxKey struct{}

func sandboxFrom(ctx context.Context) *sandboxCtx {
	sc, _ := ctx.Value(sandboxCtxKey{}).(*sandboxCtx)
	return sc
}

// gone is how E2B's edge answers for a sandbox that is not running (or does
// not exist): 502 with its "sandbox not found" body, which the SDKs report
// as a sandbox timeout (render adds the sandboxId).
func gone(id string) error {
	return errdefs.New(kindGone, "The sandbox was not found").WithDetails(map[string]any{"sandboxId": id})
}

// The kinds only envd answers with.
var (
	kindGone       = &errdefs.Kind{Code: "sandbox_not_running", Status: http.StatusBadGateway}
	kindPortClosed = &errdefs.Kind{Code: "port_not_open", Status: http.StatusBadGateway}
	kindNoSpace    = &errdefs.Kind{Code: "not_enough_space", Status: http.StatusInsufficientStorage}
)

// inSandbox checks an envd request — port, access token, a running sandbox —
// and hands it the sandbox's agent. The token is checked before the sandbox
// is looked up, so an unauthorised caller learns nothing about it.
func (s *Server) inSandbox(needToken bool, next func(http.ResponseWriter, *http.Request, *sandboxCtx) error) handler {
	return func(w http.ResponseWriter, r *http.Request) error {
		t, _ := r.Context().Value(targetKey{}).(target)
		if t.port != EnvdPort {
			return errdefs.New(kindPortClosed, "port %s is not open: SPACE sandboxes serve only envd (port %s)", t.port, EnvdPort)
		}
		var project string // the project the credential acts in ("": none checked)
		if needToken {
			var tokenID string
			var err error
			f, signed, serr := signedRequest(r)
			switch {
			case r.URL.Path == "/files" && r.Header.Get("X-Access-Token") == "" && (signed || serr != nil):
				// As envd: a token in the header wins over a signature.
				if err = serr; err == nil {
					tokenID, err = s.signedBy(r.Context(), f, t.sandboxID)
				}
			default:
				tokenID, err = s.cfg.Commands.Signer().VerifySandboxAccess(r.Header.Get("X-Access-Token"), t.sandboxID)
			}
			if err == nil {
				// It ends with the API token it was issued to, and acts
				// in that token's project.
				var tok store.Token
				tok, err = s.cfg.Tokens.Active(r.Context(), tokenID)
				project = tok.Project
				// A read-only key's access token reads files and lists
				// processes; it changes nothing.
				if err == nil && tok.Role.Rank() < store.RoleMember.Rank() && !readCall(r.Method, r.URL.Path) {
					err = errdefs.New(errdefs.PermissionDenied, "this access token's API key is read-only")
				}
			}
			if err != nil {
				return err
			}
		}
		if !ids.Valid(ids.Sandbox, t.sandboxID) {
			return gone(t.sandboxID)
		}
		ag, sb, err := s.cfg.Commands.Agents().Agent(r.Context(), t.sandboxID)
		if err != nil {
			if errors.Is(err, errdefs.NotFound) || errors.Is(err, errdefs.FailedPrecondition) {
				err = gone(t.sandboxID)
			}
			return err
		}
		if sb.Pool != "" || (project != "" && sb.Project != project) {
			return gone(t.sandboxID)
		}
		user := r.URL.Query().Get("username")
		if user == "" {
			user = basicUser(r.Header.Get("Authorization"))
		}
		if user == "" {
			user = DefaultUser
		}
		sc := &sandboxCtx{sb: sb, agent: ag, user: user}
		return next(w, r.WithContext(context.WithValue(r.Context(), sandboxCtxKey{}, sc)), sc)
	}
}

// basicUser is the user name of an "Authorization: Basic" header (envd's
// way of naming the user), "" when there is none.
func basicUser(h string) string {
	v, ok := strings.CutPrefix(h, "Basic ")
	if !ok {
		return ""
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(v))
	if err != nil {
		return ""
	}
	user, _, _ := strings.Cut(string(b), ":")
	return user
}

// resolvePath makes an envd path absolute: relative paths (and "~/…") are
// under the user's home, as envd does.
func resolvePath(ctx context.Context, sc *sandboxCtx, p string) (string, error) {
	if p == "" || strings.IndexByte(p, 0) >= 0 || len(p) > 4096 {
		return "", errdefs.New(errdefs.InvalidArgument, "path must be 1 to 4096 bytes without NUL")
	}
	if p[0] == '/' {
		return path.Clean(p), nil
	}
	home := homeOf(ctx, sc.agent, sc.user)
	p = strings.TrimPrefix(strings.TrimPrefix(p, "~"), "/")
	return path.Join(home, p), nil
}

// homeOf finds a user's home in the sandbox's /etc/passwd.
func homeOf(ctx context.Context, ag *sandboxio.Agent, user string) string {
	def := "/home/" + user
	if user == "root" || user == "0" {
		def = "/root"
	}
	data, err := ag.ReadSmall(ctx, "/etc/passwd", 1<<20)
	if err != nil {
		return def
	}
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	for sc.Scan() {
		f := strings.Split(sc.Text(), ":")
		if len(f) >= 6 && (f[0] == user || f[2] == user) && strings.HasPrefix(f[5], "/") {
			return f[5]
		}
	}
	return def
}

// fileError maps an agent's file failure to what envd answers.
func fileError(err error) error {
	if errors.Is(err, errdefs.ResourceExhausted) {
		_, msg, _ := errdefs.Public(err)
		return errdefs.New(kindNoSpace, "%s", msg)
	}
	if errors.Is(err, errdefs.FailedPrecondition) {
		_, msg, _ := errdefs.Public(err)
		return errdefs.New(errdefs.InvalidArgument, "%s", msg)
	}
	return err
}

// fileParams are the query parameters of GET and POST /files.
var fileParams = map[string]bool{"path": true, "username": true, "signature": true, "signature_expiration": true}

func (s *Server) download(w http.ResponseWriter, r *http.Request, sc *sandboxCtx) error {
	for k := range r.URL.Query() {
		if !fileParams[k] {
			return errdefs.New(errdefs.InvalidArgument, "unknown query parameter %q", k)
		}
	}
	name, err := resolvePath(r.Context(), sc, r.URL.Query().Get("path"))
	if err != nil {
		return err
	}
	f, err := sc.agent.Open(r.Context(), name)
	if err != nil {
		return fileError(err)
	}
	s.cfg.Engine.Touch(sc.sb.ID)
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(name)}))
	if f.Size >= 0 { // else chunked: a /proc file's size is known at its end
		h.Set("Content-Length", strconv.FormatInt(f.Size, 10))
	}
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	if n, err := io.Copy(w, f); err != nil {
		s.log.Warn("E2B file read ended early", "sandbox_id", sc.sb.ID, "path", name, "sent", n, "size", f.Size, "err", err)
		panic(http.ErrAbortHandler)
	}
	return nil
}

// entryInfo is envd's answer to an upload: one per written file.
type entryInfo struct {
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Path     string            `json:"path"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// metadataHeader prefixes the request headers an upload's metadata travels
// in, as envd reads them: X-Metadata-<key>: <value>, keys lower-cased, the
// first value of a repeated header.
const metadataHeader = "X-Metadata-"

func uploadMetadata(h http.Header) map[string]string {
	var m map[string]string
	for name, v := range h {
		key, ok := strings.CutPrefix(name, metadataHeader)
		if !ok || key == "" || len(v) == 0 {
			continue
		}
		if m == nil {
			m = map[string]string{}
		}
		m[strings.ToLower(key)] = v[0]
	}
	return m
}

func (s *Server) upload(w http.ResponseWriter, r *http.Request, sc *sandboxCtx) error {
	for k := range r.URL.Query() {
		if !fileParams[k] {
			return errdefs.New(errdefs.InvalidArgument, "unknown query parameter %q", k)
		}
	}
	ctx := r.Context()
	body := io.Reader(http.MaxBytesReader(w, r.Body, MaxFileSize))
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip":
		gz, err := gzip.NewReader(body)
		if err != nil {
			return errdefs.New(errdefs.InvalidArgument, "body is not gzip: %v", err)
		}
		body = &limited{r: gz, n: MaxFileSize}
	default:
		return errdefs.New(errdefs.InvalidArgument, "Content-Encoding %q is not supported (gzip is)", enc)
	}
	query := r.URL.Query().Get("path")
	meta := uploadMetadata(r.Header)
	write := func(dest string, data io.Reader) (entryInfo, error) {
		if dest == "" {
			return entryInfo{}, errdefs.New(errdefs.InvalidArgument, "no destination: give ?path= or a file name")
		}
		name, err := resolvePath(ctx, sc, dest)
		if err != nil {
			return entryInfo{}, err
		}
		e, err := sc.agent.WriteFile(ctx, sandboxio.Write{Path: name, Mode: 0o644, User: sc.user, Metadata: meta}, data)
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) || errors.Is(err, errTooLarge) {
				return entryInfo{}, errdefs.New(errdefs.TooLarge, "file exceeds %d bytes", MaxFileSize)
			}
			return entryInfo{}, fileError(err)
		}
		return entryInfo{Name: path.Base(name), Type: "file", Path: name, Metadata: e.Metadata}, nil
	}
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		mt = "application/octet-stream"
	}
	out := []entryInfo{}
	switch mt {
	case "multipart/form-data":
		mr := multipart.NewReader(body, params["boundary"])
		for {
			part, err := mr.NextRawPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return errdefs.New(errdefs.InvalidArgument, "malformed multipart body: %v", err)
			}
			// Part.FileName() drops directories; E2B puts the full
			// destination path there, so read the header ourselves.
			_, dp, err := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			if err != nil || dp["name"] != "file" {
				part.Close()
				continue
			}
			// As envd: the request's ?path= decides; a part's file name
			// (E2B puts the full destination there) only when there is none.
			dest := query
			if dest == "" {
				dest = dp["filename"]
			}
			if name, err := resolvePath(ctx, sc, dest); err == nil && slices.ContainsFunc(out, func(e entryInfo) bool { return e.Path == name }) {
				part.Close()
				return errdefs.New(errdefs.InvalidArgument, "two files for the same path %s in one upload", name)
			}
			e, err := write(dest, part)
			part.Close()
			if err != nil {
				return err
			}
			out = append(out, e)
		}
		if len(out) == 0 {
			return errdefs.New(errdefs.InvalidArgument, "the multipart body has no part named \"file\"")
		}
	default:
		e, err := write(query, body)
		if err != nil {
			return err
		}
		out = append(out, e)
	}
	s.cfg.Engine.Touch(sc.sb.ID)
	return edge.JSON(w, http.StatusOK, out)
}

var errTooLarge = errors.New("file too large")

// limited fails (rather than truncates) past n bytes.
type limited struct {
	r io.Reader
	n int64
}

func (l *limited) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	l.n -= int64(n)
	if l.n < 0 {
		return n, errTooLarge
	}
	return n, err
}
