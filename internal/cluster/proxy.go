package cluster

import (
	"net/http"
	"net/http/httputil"
	"net/url"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
)

// ForwardedHeader marks a request one member forwarded to another; it is
// never forwarded again (a sandbox that moved meanwhile is answered by the
// member that got it).
const ForwardedHeader = "X-Space-Forwarded"

// Forwarder sends a request that needs a sandbox's agent to the node that
// runs the sandbox, on one of its listeners.
type Forwarder struct {
	c    *Cluster
	addr func(store.Member) string
	// DataPlaneURL, when set, asks the node to name this data plane in the
	// attach URLs of sessions it creates (--proxy-data-plane).
	DataPlaneURL string
	// Render writes an error in the listener's format.
	Render func(w http.ResponseWriter, r *http.Request, err error)
}

// APIForwarder forwards to nodes' API listeners; ECWForwarder to their
// E2B listeners.
func (c *Cluster) APIForwarder() *Forwarder {
	return &Forwarder{c: c, addr: func(m store.Member) string { return m.URL }}
}

// DataPlaneForwarder forwards to nodes' data planes.
func (c *Cluster) DataPlaneForwarder() *Forwarder {
	return &Forwarder{c: c, addr: func(m store.Member) string { return m.DataPlaneURL }}
}

// ECWForwarder forwards to nodes' E2B listeners.
func (c *Cluster) ECWForwarder() *Forwarder {
	return &Forwarder{c: c, addr: func(m store.Member) string { return m.ECWURL }}
}

// DataPlaneHeader carries the data plane a forwarded request's sessions
// are to be attached through.
const DataPlaneHeader = "X-Space-Data-Plane-URL"

// AttachBase is the data plane a request forwarded by a member asks its
// sessions to name ("" for one that is not from a member).
func (c *Cluster) AttachBase(r *http.Request) string {
	if !c.Authorized(r) {
		return ""
	}
	return r.Header.Get(DataPlaneHeader)
}

// Forward serves r by node and reports true, or reports false when node
// is this process (or r was forwarded here already): the caller serves it.
func (f *Forwarder) Forward(w http.ResponseWriter, r *http.Request, node string) bool {
	if node == f.c.cfg.Self.ID || r.Header.Get(ForwardedHeader) != "" {
		return false
	}
	m, ok := f.c.member(node)
	var target *url.URL
	var err error
	if ok && f.c.alive(m) && f.addr(m) != "" {
		target, err = url.Parse(f.addr(m))
	}
	if !ok || !f.c.alive(m) || f.addr(m) == "" || err != nil {
		f.render(w, r, errdefs.New(errdefs.Unavailable, "the node that runs this sandbox (%s) is not reachable now", node))
		return true
	}
	p := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = pr.In.Host // (E2B routes by host name)
			pr.SetXForwarded()
			pr.Out.Header.Set(ForwardedHeader, f.c.cfg.Self.ID)
			// The member's word, which the node trusts: a client's own
			// headers of these names never pass.
			pr.Out.Header.Set(KeyHeader, f.c.cfg.Key)
			pr.Out.Header.Del(DataPlaneHeader)
			if f.DataPlaneURL != "" {
				pr.Out.Header.Set(DataPlaneHeader, f.DataPlaneURL)
			}
		},
		FlushInterval: -1, // streams (Connect, SSE) go out as they come
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			f.c.log.Warn("forward a request to a node", "node", node, "path", r.URL.Path, "err", err)
			f.render(w, r, errdefs.New(errdefs.Unavailable, "the node that runs this sandbox (%s) did not answer", node))
		},
	}
	p.ServeHTTP(w, r)
	return true
}

func (f *Forwarder) render(w http.ResponseWriter, r *http.Request, err error) {
	if f.Render != nil {
		f.Render(w, r, err)
		return
	}
	writeErr(w, err)
}
