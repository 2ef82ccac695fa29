package console

import (
	"io/fs"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The console serves its files with a strict content security policy,
// nothing else under /console/ but the data plane, and hands every other
// path to the API.
func TestHandlerRoutes(t *testing.T) {
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Header().Set("X-Who", "api "+r.URL.Path) })
	data := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Header().Set("X-Who", "data "+r.URL.Path) })
	h := Handler(api, data)
	get := func(method, path string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(method, path, nil))
		return w
	}
	for _, tc := range []struct {
		method, path string
		code         int
		who, ctype   string
	}{
		{"GET", "/console/", 200, "", "text/html; charset=utf-8"},
		{"GET", "/console/index.html", 200, "", "text/html; charset=utf-8"},
		{"GET", "/console/app.js", 200, "", "text/javascript; charset=utf-8"},
		{"GET", "/console/vendor/xterm/xterm.mjs", 200, "", "text/javascript; charset=utf-8"},
		{"GET", "/console/style.css", 200, "", "text/css; charset=utf-8"},
		{"HEAD", "/console/app.js", 200, "", "text/javascript; charset=utf-8"},
		{"GET", "/console", 301, "", ""},
		{"GET", "/console/nope.js", 404, "", ""},
		{"GET", "/console/pages/", 404, "", ""},
		{"GET", "/console/pages", 404, "", ""},
		{"GET", "/console/./app.js", 404, "", ""},
		{"GET", "/console/vendor//xterm/xterm.mjs", 404, "", ""},
		{"POST", "/console/app.js", 405, "", ""},
		{"GET", "/console/data/v1/sessions/proc_x/events", 200, "data /v1/sessions/proc_x/events", ""},
		{"POST", "/console/data/v1/sessions/proc_x/stdin", 200, "data /v1/sessions/proc_x/stdin", ""},
		{"GET", "/v1/sandboxes", 200, "api /v1/sandboxes", ""},
		{"GET", "/", 200, "api /", ""},
		{"GET", "/consoles", 200, "api /consoles", ""},
	} {
		w := get(tc.method, tc.path)
		if w.Code != tc.code || w.Header().Get("X-Who") != tc.who {
			t.Errorf("%s %s: %d %q, want %d %q", tc.method, tc.path, w.Code, w.Header().Get("X-Who"), tc.code, tc.who)
		}
		if tc.ctype != "" && w.Header().Get("Content-Type") != tc.ctype {
			t.Errorf("%s %s: Content-Type %q", tc.method, tc.path, w.Header().Get("Content-Type"))
		}
		if strings.HasPrefix(tc.path, "/console/") && !strings.HasPrefix(tc.path, "/console/data/") {
			if csp := w.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
				t.Errorf("%s: CSP %q", tc.path, csp)
			}
			if w.Header().Get("X-Content-Type-Options") != "nosniff" {
				t.Errorf("%s: no nosniff", tc.path)
			}
		}
	}
	if loc := get("GET", "/console").Header().Get("Location"); loc != "/console/" {
		t.Errorf("redirect to %q", loc)
	}
}

// Every module the page imports is embedded (a missing one would only
// show in a browser), and no file loads anything from another origin.
func TestAssetsAreSelfContained(t *testing.T) {
	root, _ := fs.Sub(assets, "assets")
	err := fs.WalkDir(root, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, _ := fs.ReadFile(root, path)
		text := string(b)
		if strings.HasSuffix(path, ".js") {
			for _, line := range strings.Split(text, "\n") {
				line = strings.TrimSpace(line)
				if !strings.HasPrefix(line, "import ") {
					continue
				}
				i := strings.LastIndex(line, " from '")
				if i < 0 {
					t.Errorf("%s: import without from: %s", path, line)
					continue
				}
				spec := strings.TrimSuffix(strings.TrimSuffix(line[i+len(" from '"):], ";"), "'")
				target := pathJoin(path, spec)
				if _, err := fs.Stat(root, target); err != nil {
					t.Errorf("%s imports %s: %v", path, spec, err)
				}
			}
		}
		if !strings.HasPrefix(path, "vendor/") && (strings.Contains(text, "http://") || strings.Contains(text, "https://")) && !strings.Contains(text, "http://www.w3.org/2000/svg") {
			t.Errorf("%s names another origin", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func pathJoin(from, spec string) string {
	dir := from[:strings.LastIndex(from, "/")+1]
	parts := strings.Split(dir+spec, "/")
	var out []string
	for _, p := range parts {
		switch p {
		case ".", "":
		case "..":
			out = out[:len(out)-1]
		default:
			out = append(out, p)
		}
	}
	return strings.Join(out, "/")
}
