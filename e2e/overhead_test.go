package e2e

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestProjectsOverheadFakeRuntime measures what projects cost the control
// plane: GET /v1/sandboxes/{id} and POST /v1/sandboxes throughput from 16
// clients, on the previous release (no projects) and on this one (a
// member token of a project with quotas, so every create runs the quota
// check), in the same run on the same host. The FAKE runtime keeps the
// runtime's work out of the numbers. It reports, asserts no timing, and
// runs only when SPACE_BENCH_PROJECTS=1 (it is a measurement, not a test).
func TestProjectsOverheadFakeRuntime(t *testing.T) {
	if os.Getenv("SPACE_BENCH_PROJECTS") != "1" {
		t.Skip("a measurement: SPACE_BENCH_PROJECTS=1 runs it")
	}
	oldBin, _ := buildRelease(t, previousRelease, "spacefake")
	const clients, creates, readFor = 16, 400, 5 * time.Second
	measure := func(s *server, token string) (gets, posts float64) {
		sbx := ""
		r := s.do("POST", "/v1/sandboxes", token, []byte(`{}`))
		if r.status != 202 {
			t.Fatalf("create = %d %s", r.status, r.body)
		}
		sbx = strings.Split(strings.Split(string(r.body), `"id":"`)[1], `"`)[0]
		hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
		var n atomic.Int64
		var wg sync.WaitGroup
		deadline := time.Now().Add(readFor)
		for range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) {
					req, _ := http.NewRequest("GET", s.url("/v1/sandboxes/"+sbx), nil)
					req.Header.Set("Authorization", "Bearer "+token)
					resp, err := hc.Do(req)
					if err == nil {
						resp.Body.Close()
						if resp.StatusCode == 200 {
							n.Add(1)
						}
					}
				}
			}()
		}
		wg.Wait()
		gets = float64(n.Load()) / readFor.Seconds()
		var made atomic.Int64
		start := time.Now()
		per := creates / clients
		for range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range per {
					req, _ := http.NewRequest("POST", s.url("/v1/sandboxes"), strings.NewReader(`{}`))
					req.Header.Set("Authorization", "Bearer "+token)
					req.Header.Set("Content-Type", "application/json")
					resp, err := hc.Do(req)
					if err == nil {
						resp.Body.Close()
						if resp.StatusCode == 202 {
							made.Add(1)
						}
					}
				}
			}()
		}
		wg.Wait()
		posts = float64(made.Load()) / time.Since(start).Seconds()
		if made.Load() != int64(per*clients) {
			t.Errorf("only %d of %d creates accepted", made.Load(), per*clients)
		}
		return gets, posts
	}
	args := []string{"--runtime", "fake", "--max-sandboxes", "0", "--idle-timeout", "1h"}
	old := startServer(t, serverOpts{bin: oldBin, args: args, env: []string{"SPACE_STORE="}})
	oldGets, oldPosts := measure(old, old.token)
	old.stop()
	killAgents(old.dataDir)

	cur := startServer(t, serverOpts{args: args, env: []string{"SPACE_STORE="}})
	if r := cur.do("POST", "/v1/projects", cur.token, []byte(`{"name":"bench","limits":{"sandboxes":100000,"memory_mib":100000000}}`)); r.status != 201 {
		t.Fatalf("project = %d %s", r.status, r.body)
	}
	r := cur.do("POST", "/v1/tokens", cur.token, []byte(`{"name":"bench","project":"bench","role":"member"}`))
	member := strings.Split(strings.Split(string(r.body), `"value":"`)[1], `"`)[0]
	newGets, newPosts := measure(cur, member)
	cur.stop()
	killAgents(cur.dataDir)

	table := fmt.Sprintf("\n| %d clients, SQLite, fake runtime | previous release (no projects) | projects (member token, quotas set) | ratio |\n| --- | --- | --- | --- |\n"+
		"| GET /v1/sandboxes/{id} | %.0f req/s | %.0f req/s | %.2f |\n| POST /v1/sandboxes (accepted) | %.0f req/s | %.0f req/s | %.2f |\n",
		clients, oldGets, newGets, newGets/oldGets, oldPosts, newPosts, newPosts/oldPosts)
	t.Log(table)
	if out := os.Getenv("SPACE_BENCH_OUT"); out != "" {
		os.WriteFile(out, []byte(table), 0o644)
	}
}
