package cluster

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/lifecycle"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
	"github.com/spacesandbox/space/internal/store/sqlite"
)

func node(id string, state store.MemberState, max, mem int, rts ...string) store.Member {
	return store.Member{ID: id, Role: store.RoleNode, State: state, Capacity: store.Capacity{MaxSandboxes: max, MemoryMiB: mem, Runtimes: rts}}
}

func TestPlace(t *testing.T) {
	need := lifecycle.Need{Runtime: "gvisor", Resources: sandbox.Resources{MemoryMiB: 512}}
	cases := []struct {
		name  string
		nodes []store.Member
		loads map[string]store.NodeLoad
		need  lifecycle.Need
		want  []string // any of
		err   *errdefs.Kind
	}{
		{"least loaded", []store.Member{node("a", "ready", 10, 0, "gvisor"), node("b", "ready", 10, 0, "gvisor")},
			map[string]store.NodeLoad{"a": {Sandboxes: 3}, "b": {Sandboxes: 1}}, need, []string{"b"}, nil},
		{"memory counts", []store.Member{node("a", "ready", 0, 4096, "gvisor"), node("b", "ready", 0, 4096, "gvisor")},
			map[string]store.NodeLoad{"a": {MemoryMiB: 3800}, "b": {MemoryMiB: 1000}}, need, []string{"b"}, nil},
		{"cordoned and draining nodes take nothing", []store.Member{node("a", "cordoned", 10, 0, "gvisor"), node("b", "draining", 10, 0, "gvisor"), node("c", "ready", 10, 0, "gvisor")},
			map[string]store.NodeLoad{"c": {Sandboxes: 9}}, need, []string{"c"}, nil},
		{"runtime must be offered", []store.Member{node("a", "ready", 10, 0, "vm"), node("b", "ready", 10, 0, "gvisor", "vm")},
			nil, need, []string{"b"}, nil},
		{"prefer kept when it fits", []store.Member{node("a", "ready", 10, 0, "gvisor"), node("b", "ready", 10, 0, "gvisor")},
			map[string]store.NodeLoad{"a": {Sandboxes: 8}}, lifecycle.Need{Runtime: "gvisor", Prefer: "a"}, []string{"a"}, nil},
		{"prefer left when full", []store.Member{node("a", "ready", 2, 0, "gvisor"), node("b", "ready", 10, 0, "gvisor")},
			map[string]store.NodeLoad{"a": {Sandboxes: 2}}, lifecycle.Need{Runtime: "gvisor", Prefer: "a"}, []string{"b"}, nil},
		{"template cached breaks a near tie", []store.Member{node("a", "ready", 100, 0, "gvisor"), {ID: "b", Role: store.RoleNode, State: "ready", Templates: []string{"sha256:t"}, Capacity: store.Capacity{MaxSandboxes: 100, Runtimes: []string{"gvisor"}}}},
			map[string]store.NodeLoad{"b": {Sandboxes: 1}}, lifecycle.Need{Runtime: "gvisor", Template: "sha256:t"}, []string{"b"}, nil},
		{"ties spread", []store.Member{node("a", "ready", 10, 0, "gvisor"), node("b", "ready", 10, 0, "gvisor")},
			nil, need, []string{"a", "b"}, nil},
		{"every node full", []store.Member{node("a", "ready", 1, 0, "gvisor")},
			map[string]store.NodeLoad{"a": {Sandboxes: 1}}, need, nil, errdefs.ResourceExhausted},
		{"no node runs it", []store.Member{node("a", "ready", 1, 0, "vm"), node("b", "cordoned", 1, 0, "gvisor")},
			nil, need, nil, errdefs.Unavailable},
		{"no nodes", nil, nil, need, nil, errdefs.Unavailable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			seen := map[string]bool{}
			for range 50 {
				got, err := place(tc.nodes, tc.loads, tc.need)
				if tc.err != nil {
					if !errors.Is(err, tc.err) {
						t.Fatalf("err = %v, want %s", err, tc.err.Code)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				seen[got] = true
			}
			for got := range seen {
				if !strings.Contains(","+strings.Join(tc.want, ",")+",", ","+got+",") {
					t.Fatalf("placed on %s, want one of %v", got, tc.want)
				}
			}
			if len(tc.want) > 1 && len(seen) != len(tc.want) {
				t.Fatalf("ties went to %v only (want all of %v)", seen, tc.want)
			}
		})
	}
}

// newCluster is a member on a real SQLite store.
func newCluster(t *testing.T, self store.Member) (*Cluster, *sqlite.Store) {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "space.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	c, err := New(Config{Store: st, Self: self, Key: "0123456789abcdef-key", Heartbeat: 50 * time.Millisecond, LostAfter: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Join(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, st
}

type fakeNodeEngine struct{ ran, claimed []string }

func (f *fakeNodeEngine) Run(_ context.Context, id string) error {
	f.ran = append(f.ran, id)
	return nil
}

func (f *fakeNodeEngine) Claimed(_ context.Context, id string) error {
	f.claimed = append(f.claimed, id)
	return errdefs.New(errdefs.FailedPrecondition, "not here")
}

// The node's cluster endpoints: only with the cluster key, only well-formed
// ids, everything else goes to the API.
func TestNodeHandler(t *testing.T) {
	c, _ := newCluster(t, store.Member{ID: ids.New(ids.Node), Role: store.RoleNode, BootID: "b1"})
	e := &fakeNodeEngine{}
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(299) })
	h := c.NodeHandler(e, api)
	op := ids.New(ids.Operation)
	do := func(method, path, key string) int {
		r := httptest.NewRequest(method, path, nil)
		if key != "" {
			r.Header.Set(KeyHeader, key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	for _, tc := range []struct {
		method, path, key string
		want              int
	}{
		{"POST", "/internal/v1/operations/" + op + ":run", "", 401},
		{"POST", "/internal/v1/operations/" + op + ":run", "0123456789abcdef-kez", 401},
		{"GET", "/internal/v1/operations/" + op + ":run", "0123456789abcdef-key", 405},
		{"POST", "/internal/v1/operations/op_bad:run", "0123456789abcdef-key", 400},
		{"POST", "/internal/v1/nothing", "0123456789abcdef-key", 404},
		{"POST", "/internal/v1/operations/" + op + ":run", "0123456789abcdef-key", 204},
		{"POST", "/internal/v1/sandboxes/" + ids.New(ids.Sandbox) + ":claimed", "0123456789abcdef-key", 409},
		{"GET", "/v1/sandboxes", "", 299},
	} {
		if got := do(tc.method, tc.path, tc.key); got != tc.want {
			t.Errorf("%s %s (key %q) = %d, want %d", tc.method, tc.path, tc.key, got, tc.want)
		}
	}
	if len(e.ran) != 1 || e.ran[0] != op {
		t.Fatalf("ran %v", e.ran)
	}
}

// Forwarding reaches the node's listener with the request as sent, never
// twice, and says so clearly when the node is gone.
func TestForwarder(t *testing.T) {
	var got *http.Request
	var body string
	nodeSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r
		b, _ := io.ReadAll(r.Body)
		body = string(b)
		w.WriteHeader(201)
		io.WriteString(w, "from the node")
	}))
	defer nodeSrv.Close()
	ctl, st := newCluster(t, store.Member{ID: "boot-c", Role: store.RoleControl, BootID: "boot-c"})
	nodeID := ids.New(ids.Node)
	now := time.Now().UTC()
	st.JoinMember(context.Background(), &store.Member{ID: nodeID, Role: store.RoleNode, BootID: "boot-n", URL: nodeSrv.URL, StartedAt: now, HeartbeatAt: now})
	ctl.refresh(context.Background())
	f := ctl.APIForwarder()

	r := httptest.NewRequest("PUT", "/v1/sandboxes/x/files?path=/a", strings.NewReader("data"))
	r.Header.Set("Authorization", "Bearer tok")
	w := httptest.NewRecorder()
	if !f.Forward(w, r, nodeID) || w.Code != 201 || w.Body.String() != "from the node" {
		t.Fatalf("forward = %d %q", w.Code, w.Body)
	}
	if got.URL.RawQuery != "path=/a" || got.Header.Get("Authorization") != "Bearer tok" || got.Header.Get(ForwardedHeader) != "boot-c" || body != "data" {
		t.Fatalf("node got %s %s %v body %q", got.Method, got.URL, got.Header, body)
	}
	// Already forwarded once, or for this process itself: served here.
	r.Header.Set(ForwardedHeader, "boot-x")
	if f.Forward(httptest.NewRecorder(), r, nodeID) {
		t.Fatal("a forwarded request was forwarded again")
	}
	if f.Forward(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil), "boot-c") {
		t.Fatal("a request for this process was forwarded")
	}
	// A node that stopped heartbeating: 503 at once.
	time.Sleep(400 * time.Millisecond)
	w = httptest.NewRecorder()
	if !f.Forward(w, httptest.NewRequest("GET", "/v1/sandboxes/x/files?path=/a", nil), nodeID) || w.Code != 503 || !strings.Contains(w.Body.String(), "unavailable") {
		t.Fatalf("forward to a silent node = %d %s", w.Code, w.Body)
	}
}

// A member that stops heartbeating is lost after LostAfter; the sweep
// fails its sandboxes once, and a control replica's record goes.
func TestSweepMarksSilentMembersLost(t *testing.T) {
	c, st := newCluster(t, store.Member{ID: "boot-c", Role: store.RoleControl, BootID: "boot-c"})
	ctx := context.Background()
	old := time.Now().UTC().Add(-time.Minute)
	nodeID := ids.New(ids.Node)
	st.JoinMember(ctx, &store.Member{ID: nodeID, Role: store.RoleNode, BootID: "n", StartedAt: old, HeartbeatAt: old})
	st.JoinMember(ctx, &store.Member{ID: "boot-d", Role: store.RoleControl, BootID: "boot-d", StartedAt: old, HeartbeatAt: old})
	var failed []string
	s := Sweeper{Lock: noLock{}, FailNode: func(_ context.Context, n string) (int, error) { failed = append(failed, n); return 1, nil }}
	if !c.sweepOnce(ctx, s, false, false, false) {
		t.Fatal("sweep did not run")
	}
	if len(failed) != 1 || failed[0] != nodeID {
		t.Fatalf("failed nodes %v", failed)
	}
	if m, _ := st.GetMember(ctx, nodeID); m.State != store.MemberLost {
		t.Fatalf("silent node is %s", m.State)
	}
	if _, err := st.GetMember(ctx, "boot-d"); !errors.Is(err, errdefs.NotFound) {
		t.Fatalf("a silent control replica's record stays: %v", err)
	}
	if m, _ := st.GetMember(ctx, "boot-c"); m.State != store.MemberReady {
		t.Fatalf("the live replica is %s", m.State)
	}
	c.sweepOnce(ctx, s, false, false, false)
	if len(failed) != 1 {
		t.Fatalf("a lost node was failed again: %v", failed)
	}
	c.sweepOnce(ctx, s, true, false, false) // a new leader goes over lost nodes again
	if len(failed) != 2 {
		t.Fatalf("a new leader skipped lost nodes: %v", failed)
	}
	if c.OwnerAlive(ctx, "boot-d") || !c.OwnerAlive(ctx, "boot-c") {
		t.Fatal("owner liveness is wrong")
	}
}

type noLock struct{}

func (noLock) TryLock(context.Context, string) (func(), bool, error) { return func() {}, true, nil }
