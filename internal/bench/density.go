package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/procfs"
)

// Density measures how many idle sandboxes one server holds and what they
// cost: it creates cfg.Density sandboxes (a few at a time), then, while
// they all idle, reads them back one by one, creates one more, and reports
// host memory per sandbox (from this host's MemAvailable, so run it on the
// server's host) and the server's own resident memory (its /metrics).
// Every sandbox it made is deleted before it returns.
func Density(ctx context.Context, cfg Config) (*Report, error) {
	b, rep, err := newBench(cfg)
	if err != nil {
		return nil, err
	}
	c := b.c
	n := cfg.Density
	var mu sync.Mutex
	var made []string
	defer func() {
		b.say("density: deleting %d sandboxes", len(made))
		parallel(context.WithoutCancel(ctx), len(made), 4, func(ctx context.Context, i int) error {
			c.Lifecycle(ctx, "delete", made[i], "")
			return nil
		})
	}()
	avail0, _ := memAvailable()
	rss0, _ := serverRSS(ctx, cfg)
	b.say("density: creating %d sandboxes, 4 at a time", n)
	start := time.Now()
	var creates []time.Duration
	err = parallel(ctx, n, 4, func(ctx context.Context, i int) error {
		id, d, err := b.create(ctx)
		mu.Lock()
		defer mu.Unlock()
		if id != "" {
			made = append(made, id)
		}
		if err != nil {
			return fmt.Errorf("sandbox %d of %d: %w", i+1, n, err)
		}
		creates = append(creates, d)
		if len(creates)%50 == 0 {
			b.say("density: %d running (%.0fs)", len(creates), time.Since(start).Seconds())
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	held := time.Since(start)
	// Let the fleet settle into idling before it is measured.
	time.Sleep(5 * time.Second)
	avail1, memErr := memAvailable()
	rss1, rssErr := serverRSS(ctx, cfg)
	rep.Rows = append(rep.Rows, rateRow("density_held", fmt.Sprintf("idle running sandboxes held at once (created 4 at a time in %.0f s)", held.Seconds()), "sandboxes", "1,000 on 24 GiB, 2 cores", []float64{float64(n)}))
	rep.Rows = append(rep.Rows, latencyRow("density_create", fmt.Sprintf("create → running while filling to %d", n), "", creates))
	if memErr == nil && avail0 > 0 {
		per := float64(avail0-avail1) / float64(n) / (1 << 20)
		rep.Rows = append(rep.Rows, rateRow("density_memory", "host memory per idle sandbox (fall in MemAvailable / sandboxes)", "MiB", "", []float64{per}))
	}
	if rssErr == nil && rss1 > 0 {
		rep.Rows = append(rep.Rows, rateRow("density_server", fmt.Sprintf("server resident memory with %d sandboxes (was %.0f MiB)", n, float64(rss0)/(1<<20)), "MiB", "", []float64{float64(rss1) / (1 << 20)}))
	}

	reads := max(1000, 2*n)
	b.say("density: %d reads of random sandboxes, 4 clients", reads)
	var ds []time.Duration
	err = parallel(ctx, reads, 4, func(ctx context.Context, i int) error {
		id := made[rand.IntN(len(made))]
		t0 := time.Now()
		if _, err := c.GetSandbox(ctx, id); err != nil {
			return err
		}
		d := time.Since(t0)
		mu.Lock()
		ds = append(ds, d)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	r := latencyRow("density_get", fmt.Sprintf("GET /v1/sandboxes/{id} with %d idle (4 clients)", n), "p99 < 50 ms", ds)
	r.P99 = pct(r.Raw, .99)
	r.Raw = nil
	rep.Rows = append(rep.Rows, r)

	b.say("density: one more create while %d idle", n)
	var one []time.Duration
	for i := 0; i < 3; i++ {
		id, d, err := b.create(ctx)
		if id != "" {
			made = append(made, id)
		}
		if err != nil {
			return nil, fmt.Errorf("create while %d idle: %w", n, err)
		}
		one = append(one, d)
	}
	rep.Rows = append(rep.Rows, latencyRow("density_create_after", fmt.Sprintf("create → running while %d idle", n), "works", one))
	printTable(cfg.Out, rep)
	return rep, nil
}

// parallel runs f for 0…n-1 with at most width at once; the first error
// stops the rest.
func parallel(ctx context.Context, n, width int, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan int)
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for w := 0; w < width; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(ctx, i); err != nil {
					once.Do(func() { first = err; cancel() })
				}
			}
		}()
	}
feed:
	for i := 0; i < n; i++ {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	return first
}

// memAvailable is this host's MemAvailable in bytes.
func memAvailable() (int64, error) {
	mem, err := procfs.MemInfo()
	if err != nil {
		return 0, err
	}
	if v, ok := mem["MemAvailable"]; ok {
		return int64(v), nil
	}
	return 0, fmt.Errorf("no MemAvailable in /proc/meminfo")
}

// serverRSS reads process_resident_memory_bytes from the server's /metrics.
func serverRSS(ctx context.Context, cfg Config) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", strings.TrimRight(cfg.APIURL, "/")+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+cfg.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 16<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "process_resident_memory_bytes "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return int64(f), err
		}
	}
	return 0, fmt.Errorf("no process_resident_memory_bytes in /metrics")
}
