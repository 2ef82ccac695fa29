package cluster_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/spacesandbox/space/internal/api"
	"github.com/spacesandbox/space/internal/auth"
	"github.com/spacesandbox/space/internal/cluster"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/lifecycle"
	"github.com/spacesandbox/space/internal/metrics"
	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/runtime/fakeruntime"
	"github.com/spacesandbox/space/internal/store"
	"github.com/spacesandbox/space/internal/store/postgres"
	"github.com/spacesandbox/space/internal/store/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// TestScaleSimulationFakeRuntime runs a cluster in one process on a real
// PostgreSQL: SPACE_SCALE_NODES nodes (default 20; the closing note's run
// used 100), each a real engine, cluster member and HTTP listener over the
// FAKE runtime (no sandbox runs: this measures the control plane, the
// store and placement), and 2 control replicas serving the real API on
// loopback. SPACE_SCALE_SANDBOXES (default 1,000; 10,000 in the note) are
// created, listed and deleted through the replicas by 32 clients. It
// checks that every create lands, that placement is even, and reports
// create and GET latency percentiles and the store's load.
//
//	SPACE_SCALE_NODES=100 SPACE_SCALE_SANDBOXES=10000 go test -run TestScaleSimulationFakeRuntime -v ./internal/cluster
func TestScaleSimulationFakeRuntime(t *testing.T) {
	nNodes, nSandboxes := envInt("SPACE_SCALE_NODES", 20), envInt("SPACE_SCALE_SANDBOXES", 1000)
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	st, err := postgres.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	live, err := st.Liveness(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const key = "scale-test-cluster-key-0123456789"
	dir := t.TempDir()
	var closers []func()
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()
	member := func(m store.Member) *cluster.Cluster {
		c, err := cluster.New(cluster.Config{Store: st, Liveness: live, Self: m, Key: key, Heartbeat: time.Second, LostAfter: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// Nodes: an engine, a member and a listener each.
	for i := range nNodes {
		id := ids.New(ids.Node)
		rt, err := fakeruntime.New(fakeruntime.Config{Dir: filepath.Join(dir, id)})
		if err != nil {
			t.Fatal(err)
		}
		c := member(store.Member{ID: id, Role: store.RoleNode, Name: fmt.Sprintf("sim-%d", i), BootID: "boot-" + id,
			Capacity: store.Capacity{VCPUs: 64, MemoryMiB: 1 << 20, MaxSandboxes: 2 * nSandboxes / nNodes, Runtimes: []string{"fake"}}})
		eng, err := lifecycle.New(lifecycle.Config{Store: st, Runtimes: []runtime.Runtime{rt}, Templates: fakeruntime.Templates{},
			SnapshotRoot: filepath.Join(dir, id, "snapshots"), Node: id, Cluster: c, MaxParallelOps: 16})
		if err != nil {
			t.Fatal(err)
		}
		if err := eng.Start(ctx); err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(c.NodeHandler(eng, http.NotFoundHandler()))
		c.SetAddresses(srv.URL, "", "")
		if _, err := c.Join(ctx); err != nil {
			t.Fatal(err)
		}
		closers = append(closers, func() { srv.Close(); eng.Close(); c.Close() })
	}
	// Two control replicas serving the API.
	tokens := auth.New(st, st)
	_, token, err := tokens.Create(ctx, "scale")
	if err != nil {
		t.Fatal(err)
	}
	var urls []string
	for i := range 2 {
		boot := fmt.Sprintf("control-%d", i)
		c := member(store.Member{ID: boot, Role: store.RoleControl, BootID: boot})
		eng, err := lifecycle.New(lifecycle.Config{Store: st, Templates: fakeruntime.Templates{}, SnapshotRoot: filepath.Join(dir, boot), Cluster: c})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Join(ctx); err != nil {
			t.Fatal(err)
		}
		if err := eng.Start(ctx); err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(api.New(api.Config{Engine: eng, Store: st, Tokens: tokens, Metrics: metrics.New(), BootID: boot,
			Forwarder: c.APIForwarder(), OwnerAlive: c.OwnerAlive, Nodes: c}))
		urls = append(urls, srv.URL)
		closers = append(closers, func() { srv.Close(); eng.Close(); c.Close() })
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	call := func(method, url string, body []byte) (int, []byte, time.Duration) {
		req, _ := http.NewRequest(method, url, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			t.Errorf("%s %s: %v", method, url, err)
			return 0, nil, 0
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, b, time.Since(start)
	}
	stats := storeStats(t, dbURL)

	// Create, through both replicas, 32 clients at a time.
	type made struct {
		id, op string
		d      time.Duration
	}
	results := make([]made, nSandboxes)
	parallel(nSandboxes, 32, func(i int) {
		status, b, d := call("POST", urls[i%2]+"/v1/sandboxes", []byte(`{"template":"base"}`))
		if status != 202 {
			t.Errorf("create %d = %d %s", i, status, b)
			return
		}
		var out struct {
			Sandbox   struct{ ID string } `json:"sandbox"`
			Operation struct{ ID string } `json:"operation"`
		}
		json.Unmarshal(b, &out)
		results[i] = made{out.Sandbox.ID, out.Operation.ID, d}
	})
	if t.Failed() {
		return
	}
	createStart := time.Now()
	// Every create finishes on its node.
	waitAll(t, func() (int, error) {
		var n int
		err := sqlQueryRow(dbURL, `SELECT COUNT(*) FROM sandboxes WHERE state = 'running'`, &n)
		return n, err
	}, nSandboxes, 5*time.Minute)
	settle := time.Since(createStart)
	created := stats()

	// GET each sandbox once through either replica, and list them all.
	gets := make([]time.Duration, nSandboxes)
	parallel(nSandboxes, 32, func(i int) {
		status, b, d := call("GET", urls[(i+1)%2]+"/v1/sandboxes/"+results[i].id, nil)
		if status != 200 {
			t.Errorf("get = %d %s", status, b)
		}
		gets[i] = d
	})
	listStart := time.Now()
	listed, cursor := 0, ""
	for {
		status, b, _ := call("GET", urls[0]+"/v1/sandboxes?limit=500&cursor="+cursor, nil)
		if status != 200 {
			t.Fatalf("list = %d %s", status, b)
		}
		var page struct {
			Items      []struct{ ID string } `json:"items"`
			NextCursor *string               `json:"next_cursor"`
		}
		json.Unmarshal(b, &page)
		listed += len(page.Items)
		if page.NextCursor == nil {
			break
		}
		cursor = *page.NextCursor
	}
	listTook := time.Since(listStart)
	if listed != nSandboxes {
		t.Fatalf("listed %d sandboxes, want %d", listed, nSandboxes)
	}
	// Placement: how even.
	per := map[string]int{}
	rows, err := sqlRows(dbURL, `SELECT node, COUNT(*) FROM sandboxes WHERE state = 'running' GROUP BY node`)
	if err != nil {
		t.Fatal(err)
	}
	for node, n := range rows {
		per[node] = n
	}
	counts := make([]int, 0, len(per))
	for _, n := range per {
		counts = append(counts, n)
	}
	slices.Sort(counts)
	if len(counts) != nNodes || counts[0] == 0 {
		t.Fatalf("sandboxes landed on %d of %d nodes: %v", len(counts), nNodes, counts)
	}

	// Delete them all.
	parallel(nSandboxes, 32, func(i int) {
		if status, b, _ := call("DELETE", urls[i%2]+"/v1/sandboxes/"+results[i].id, nil); status != 202 {
			t.Errorf("delete = %d %s", status, b)
		}
	})
	waitAll(t, func() (int, error) {
		var n int
		err := sqlQueryRow(dbURL, `SELECT COUNT(*) FROM sandboxes WHERE state = 'deleted'`, &n)
		return n, err
	}, nSandboxes, 5*time.Minute)
	deleted := stats()

	creates := make([]time.Duration, nSandboxes)
	for i, r := range results {
		creates[i] = r.d
	}
	t.Logf("%d nodes, %d sandboxes (FAKE runtime), 2 control replicas, 32 clients", nNodes, nSandboxes)
	t.Logf("create (202) p50 %v p99 %v; all running %v after the last 202", pct(creates, 50), pct(creates, 99), settle.Round(time.Millisecond))
	t.Logf("GET p50 %v p99 %v; listing all %d in pages of 500: %v", pct(gets, 50), pct(gets, 99), listed, listTook.Round(time.Millisecond))
	t.Logf("placement: per node min %d, median %d, max %d (ideal %.1f)", counts[0], counts[len(counts)/2], counts[len(counts)-1], float64(nSandboxes)/float64(nNodes))
	t.Logf("store, creates and their operations: %s", created)
	t.Logf("store, then GETs, list and deletes: %s", deleted)
}

func parallel(n, workers int, fn func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				fn(i)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

func waitAll(t *testing.T, count func() (int, error), want int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		n, err := count()
		if err == nil && n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d after %v (%v)", n, want, within, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func pct(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[(len(s)-1)*p/100].Round(10 * time.Microsecond)
}

func sqlQueryRow(url, q string, dest ...any) error {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return err
	}
	defer db.Close()
	return db.QueryRow(q).Scan(dest...)
}

func sqlRows(url, q string) (map[string]int, error) {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	rows, err := db.Query(q)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			return nil, err
		}
		out[k] = n
	}
	return out, rows.Err()
}

// storeStats returns a function that says what the database did since the
// last call: transactions committed and rows read and written, per second.
func storeStats(t *testing.T, url string) func() string {
	type snap struct {
		at                           time.Time
		commits, read, ins, upd, del int64
	}
	take := func() snap {
		var s snap
		s.at = time.Now()
		err := sqlQueryRow(url, `SELECT xact_commit, tup_returned + tup_fetched, tup_inserted, tup_updated, tup_deleted FROM pg_stat_database WHERE datname = current_database()`,
			&s.commits, &s.read, &s.ins, &s.upd, &s.del)
		if err != nil {
			t.Fatalf("read pg_stat_database: %v", err)
		}
		return s
	}
	last := take()
	return func() string {
		time.Sleep(600 * time.Millisecond) // (the statistics collector reports every 500 ms)
		cur := take()
		d := cur.at.Sub(last.at).Seconds()
		out := fmt.Sprintf("%d commits (%.0f/s), rows read %d, inserted %d, updated %d over %.1fs",
			cur.commits-last.commits, float64(cur.commits-last.commits)/d, cur.read-last.read, cur.ins-last.ins, cur.upd-last.upd, d)
		last = cur
		return out
	}
}
