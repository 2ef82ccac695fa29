// Package console serves SPACE's web console on the API listener: the
// page and its scripts under /console/ (embedded, no build step, no CDN),
// and the data plane under /console/data/ so the page's terminal reaches
// its command sessions on its own origin. The console holds no state and
// no privilege of its own: it is a client of the public API, acting with
// the API token its user typed in (kept in the tab's session storage).
package console

import (
	"embed"
	"io/fs"
	"net/http"
	"path"
	"strings"
)

//go:embed assets
var assets embed.FS

// Prefix is where the console lives on the API listener.
const Prefix = "/console/"

// dataPrefix is the data plane as the console reaches it.
const dataPrefix = Prefix + "data/"

// securityHeaders keep the page to its own scripts and its own origin:
// no inline script, nothing from elsewhere, not framed, no referrer. Inline
// styles are allowed: xterm.js sizes and colours the terminal with <style>
// elements it writes (no nonce option); the console itself never writes
// markup from data, only text.
var securityHeaders = map[string]string{
	"Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; connect-src 'self'; " +
		"font-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'",
	"X-Content-Type-Options":     "nosniff",
	"Referrer-Policy":            "no-referrer",
	"X-Frame-Options":            "DENY",
	"Cross-Origin-Opener-Policy": "same-origin",
}

// Handler serves the console and the data plane under Prefix, and passes
// every other request to api.
func Handler(api, dataPlane http.Handler) http.Handler {
	root, _ := fs.Sub(assets, "assets")
	files := http.FileServerFS(root)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		switch {
		case p == "/console":
			http.Redirect(w, r, Prefix, http.StatusMovedPermanently)
		case strings.HasPrefix(p, dataPrefix):
			// The same handler as the data plane's own listener, on this
			// origin: attachment tokens authorise it exactly as there.
			r2 := r.Clone(r.Context())
			r2.URL.Path = "/" + strings.TrimPrefix(p, dataPrefix)
			r2.URL.RawPath = ""
			dataPlane.ServeHTTP(w, r2)
		case strings.HasPrefix(p, Prefix):
			serveAsset(w, r, files, root, strings.TrimPrefix(p, Prefix))
		default:
			api.ServeHTTP(w, r)
		}
	})
}

func serveAsset(w http.ResponseWriter, r *http.Request, files http.Handler, root fs.FS, name string) {
	h := w.Header()
	for k, v := range securityHeaders {
		h.Set(k, v)
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		h.Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if name == "" {
		name = "index.html"
	}
	// Only files, by their clean names: no listings, no dot segments.
	if clean := path.Clean(name); clean != name || strings.HasSuffix(name, "/") {
		http.NotFound(w, r)
		return
	}
	if st, err := fs.Stat(root, name); err != nil || st.IsDir() {
		http.NotFound(w, r)
		return
	}
	// The page is small and changes with the binary: always revalidated.
	h.Set("Cache-Control", "no-cache")
	if name == "index.html" {
		// FileServer redirects /index.html to ./; serve the bytes instead.
		b, _ := fs.ReadFile(root, name)
		h.Set("Content-Type", "text/html; charset=utf-8")
		w.Write(b)
		return
	}
	r2 := r.Clone(r.Context())
	r2.URL.Path = "/" + name
	files.ServeHTTP(w, r2)
}
