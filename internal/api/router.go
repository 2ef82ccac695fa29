package api

import (
	"net/http"

	"github.com/spacesandbox/space/internal/store"
	"sort"
	"strings"
)

// Route is one endpoint. Pattern uses the OpenAPI path syntax: literal
// segments, "{name}" parameters, and "{name}:verb" for custom methods
// (AIP-136). A plain "{name}" never matches a segment containing ':'.
type Route struct {
	Method  string
	Pattern string
	// Auth is false only for the public endpoints (health, spec, metrics).
	Auth bool
	// Role is the least role a token needs ("": read-only for GET, member
	// for a change); Owns says what the path's {id} or {name} names, whose
	// project must be the token's (access.go).
	Role store.Role
	Owns owns
	// Node marks a route served where sandbox {id} runs (it needs the
	// sandbox's agent or network): in a cluster, the node that runs it.
	Node    bool
	Handler handlerFunc

	segs []string
}

// handlerFunc serves a matched route with its path parameters and returns
// its failure, which the edge writes (unless the response has begun).
type handlerFunc func(w http.ResponseWriter, r *http.Request, p params) error

type params map[string]string

// router matches a request path against routes.
type router struct {
	routes []*Route
}

func newRouter(routes []Route) *router {
	rt := &router{}
	for i := range routes {
		r := routes[i]
		r.segs = strings.Split(strings.Trim(r.Pattern, "/"), "/")
		rt.routes = append(rt.routes, &r)
	}
	return rt
}

// match finds the route for method and path. When the path matches but the
// method does not, it returns the allowed methods.
func (rt *router) match(method, path string) (*Route, params, []string) {
	if path != "/" && strings.HasSuffix(path, "/") {
		return nil, nil, nil
	}
	segs := strings.Split(strings.Trim(path, "/"), "/")
	var allowed []string
	for _, r := range rt.routes {
		p, ok := matchSegs(r.segs, segs)
		if !ok {
			continue
		}
		if r.Method == method || (method == http.MethodHead && r.Method == http.MethodGet) {
			return r, p, nil
		}
		allowed = append(allowed, r.Method)
	}
	sort.Strings(allowed)
	return nil, nil, allowed
}

func matchSegs(pattern, segs []string) (params, bool) {
	if len(pattern) != len(segs) {
		return nil, false
	}
	var p params
	for i, ps := range pattern {
		s := segs[i]
		if !strings.HasPrefix(ps, "{") {
			if ps != s {
				return nil, false
			}
			continue
		}
		name, verb := ps[1:], ""
		if j := strings.Index(ps, "}"); j > 0 {
			name, verb = ps[1:j], ps[j+1:]
		}
		// "{a}:{b}": two parameters split at the first ':'.
		if second, ok := strings.CutPrefix(verb, ":{"); ok && strings.HasSuffix(second, "}") {
			a, b, found := strings.Cut(s, ":")
			if !found || a == "" || b == "" || strings.Contains(b, ":") {
				return nil, false
			}
			if p == nil {
				p = params{}
			}
			p[name], p[strings.TrimSuffix(second, "}")] = a, b
			continue
		}
		val := s
		if verb != "" {
			var ok bool
			if val, ok = strings.CutSuffix(s, verb); !ok {
				return nil, false
			}
		}
		if val == "" || strings.Contains(val, ":") {
			return nil, false
		}
		if p == nil {
			p = params{}
		}
		p[name] = val
	}
	return p, true
}
