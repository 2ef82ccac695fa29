// Package ingress proxies clients to servers that run inside sandboxes:
// the data plane (by path /v1/sandboxes/{id}/ports/{port}/… or host
// {port}-{id}.{domain}) and the E2B layer (getHost's host names) both hand
// such requests here. A request needs the sandbox's ingress token unless
// the sandbox was created with public ingress; a sandbox that is not
// running answers 502 at once. WebSocket upgrades and streamed responses
// pass through.
package ingress

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"time"

	"github.com/spacesandbox/space/internal/auth"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/httpguard"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/sandbox"
)

// Header carries the ingress token; E2BTrafficHeader is E2B's name for the
// same thing.
const (
	Header           = "X-Space-Ingress-Token"
	E2BTrafficHeader = "E2b-Traffic-Access-Token"
)

// Config wires a Proxy.
type Config struct {
	// Sandbox returns a sandbox's record.
	Sandbox func(ctx context.Context, id string) (*sandbox.Sandbox, error)
	// Dial connects to a port of a running sandbox.
	Dial   func(ctx context.Context, id string, port int) (net.Conn, error)
	Signer *auth.Signer
	// Domain is the suffix of sandbox host names (may carry a port).
	Domain string
}

// Proxy serves ingress requests.
type Proxy struct {
	cfg   Config
	log   *slog.Logger
	proxy *httputil.ReverseProxy
}

type ingressTarget struct{ id, port string }

type ingressKey struct{}

// New returns a Proxy.
func New(cfg Config, log *slog.Logger) *Proxy {
	in := &Proxy{cfg: cfg, log: log}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			// addr is "<id>.sandbox:<port>" (see Rewrite).
			host, port, _ := net.SplitHostPort(addr)
			p, _ := strconv.Atoi(port)
			return cfg.Dial(ctx, strings.TrimSuffix(host, ".sandbox"), p)
		},
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 0, // servers may think as long as they like
	}
	in.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := pr.In.Context().Value(ingressKey{}).(ingressTarget)
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = t.id + ".sandbox:" + t.port
			pr.Out.Host = pr.In.Host
			pr.Out.Header.Del(Header)
			pr.Out.Header.Del(E2BTrafficHeader)
			pr.SetXForwarded()
		},
		Transport:     tr,
		FlushInterval: -1, // stream
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			t, _ := r.Context().Value(ingressKey{}).(ingressTarget)
			log.Debug("ingress: upstream failed", "sandbox_id", t.id, "port", t.port, "err", err)
			writeIngressError(w, http.StatusBadGateway, "bad_gateway", fmt.Sprintf("nothing answered on port %s in the sandbox", t.port))
		},
	}
	return in
}

// Match finds the sandbox and port a request is for, and the path to send
// on; ok=false when the request is not an ingress request.
func (in *Proxy) Match(r *http.Request) (id, port, path string, ok bool) {
	if in.cfg.Domain != "" {
		host := strings.ToLower(r.Host)
		dom := strings.ToLower(in.cfg.Domain)
		if h, _, err := net.SplitHostPort(host); err == nil && !strings.Contains(dom, ":") {
			host = h
		}
		if label, found := strings.CutSuffix(host, "."+dom); found && !strings.Contains(label, ".") {
			if p, sid, cut := strings.Cut(label, "-"); cut {
				return sid, p, r.URL.Path, true
			}
		}
	}
	rest, found := strings.CutPrefix(r.URL.Path, "/v1/sandboxes/")
	if !found {
		return "", "", "", false
	}
	sid, rest, _ := strings.Cut(rest, "/")
	rest, found = strings.CutPrefix(rest, "ports/")
	if !found {
		return "", "", "", false
	}
	p, tail, _ := strings.Cut(rest, "/")
	return sid, p, "/" + tail, true
}

// Serve proxies r to port of sandbox id, with path as its path.
func (in *Proxy) Serve(w http.ResponseWriter, r *http.Request, id, port, path string) {
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 || strconv.Itoa(p) != port {
		writeIngressError(w, http.StatusBadRequest, "invalid_argument", "malformed port")
		return
	}
	if !ids.Valid(ids.Sandbox, id) {
		writeIngressError(w, http.StatusNotFound, "not_found", "no such sandbox")
		return
	}
	sb, err := in.cfg.Sandbox(r.Context(), id)
	if err != nil || sb.State == sandbox.Deleted {
		if err != nil && !errors.Is(err, errdefs.NotFound) {
			writeIngressError(w, http.StatusServiceUnavailable, "unavailable", "cannot look the sandbox up now")
			return
		}
		writeIngressError(w, http.StatusNotFound, "not_found", "no such sandbox")
		return
	}
	if sb.Network == nil || !sb.Network.PublicIngress {
		tok := r.Header.Get(Header)
		if tok == "" {
			tok = r.Header.Get(E2BTrafficHeader)
		}
		if err := in.cfg.Signer.VerifyIngress(tok, id); err != nil {
			writeIngressError(w, http.StatusUnauthorized, "unauthenticated", "missing or invalid ingress token ("+Header+")")
			return
		}
		httpguard.Exempt(r.Context()) // authenticated: a WebSocket or long download may stay
	}
	if sb.State != sandbox.Running {
		writeIngressError(w, http.StatusBadGateway, "sandbox_not_running", fmt.Sprintf("sandbox not running (%s); wake it first", sb.State))
		return
	}
	if sb.Network == nil {
		writeIngressError(w, http.StatusBadGateway, "sandbox_not_running", "the sandbox has no network")
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), ingressKey{}, ingressTarget{id: id, port: port}))
	r.URL.Path, r.URL.RawPath = path, ""
	in.proxy.ServeHTTP(w, r)
}

func writeIngressError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, "{\"error\":{\"code\":%q,\"message\":%q}}\n", code, msg)
}
