package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/bench"
)

// TestNetworkBench measures egress on each runtime with `space bench
// --egress-only` against the test upstream, and the same transfer between
// two plain network namespaces (the baseline) in the same run, and logs
// both and their ratio. A measurement, not an assertion: it runs only with
// SPACE_NET_BENCH=1.
//
//	SPACE_NET_BENCH=1 go test -run TestNetworkBench -v ./e2e
func TestNetworkBench(t *testing.T) {
	if os.Getenv("SPACE_NET_BENCH") != "1" {
		t.Skip("a benchmark: set SPACE_NET_BENCH=1")
	}
	requireGVisor(t)
	rts := []string{"gvisor"}
	if ok, _ := vmAvailable(); ok {
		rts = append(rts, "vm")
	}
	s := startSeedServer(t, "auto")
	url := "http://" + s.up.Public[0].String() + "/bytes"
	const size = 1 << 30
	const conns = 20

	// The baseline: the same commands in a plain namespace joined straight to the upstream.
	client := s.up.Client(t, 1)
	dl, cn := bench.EgressCommands(url, size, conns)
	run := func(script string) string {
		out, err := exec.Command("ip", "netns", "exec", client, "sh", "-c", script).Output()
		if err != nil {
			t.Fatalf("baseline %q: %v", script, err)
		}
		return string(out)
	}
	baseGbit, baseConns, err := bench.ParseEgress(run(dl), run(cn))
	if err != nil {
		t.Fatal(err)
	}
	baseConn := median(baseConns)
	var report strings.Builder
	fmt.Fprintf(&report, "%-10s %12s %14s\n", "", "download", "new connection")
	fmt.Fprintf(&report, "%-10s %9.2f Gbit/s %11.3f ms\n", "baseline", baseGbit, ms(baseConn))
	for _, rt := range rts {
		out := filepath.Join(t.TempDir(), "bench.json")
		cmd := exec.Command(spaceBin, "bench", "--api-url", "http://"+s.apiAddr, "--token", s.token, "--runtime", rt,
			"--template", "seed:latest", "--runs", fmt.Sprint(conns), "--egress-url", url, "--egress-only", "--json-out", out)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("space bench on %s: %v\n%s", rt, err, b)
		}
		var rep bench.Report
		b, _ := os.ReadFile(out)
		if err := json.Unmarshal(b, &rep); err != nil || len(rep.Rows) != 2 {
			t.Fatalf("bench report: %v %s", err, b)
		}
		gbit, conn := rep.Rows[0].Value, time.Duration(rep.Rows[1].P50*float64(time.Millisecond))
		fmt.Fprintf(&report, "%-10s %9.2f Gbit/s %11.3f ms   (%.2fx the baseline's throughput, +%.3f ms per connection)\n",
			rt, gbit, ms(conn), gbit/baseGbit, ms(conn-baseConn))
	}
	t.Logf("egress, %d MiB download and the median of %d new connections:\n%s", size>>20, conns, report.String())
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
