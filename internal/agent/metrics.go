package agent

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/agent/proto"
)

// The sandbox's use of CPU, memory and disk, read as envd reads them: from
// /proc/stat, /proc/meminfo and statfs of the root — what the sandbox's own
// kernel (the guest's, or gVisor's sentry) accounts, not the host's view.

// cpuTimes is the aggregate "cpu" line of /proc/stat, in ticks.
type cpuTimes struct{ busy, total uint64 }

// readCPU returns the aggregate times and the number of CPUs.
func readCPU(stat []byte) (cpuTimes, int, error) {
	var t cpuTimes
	n := 0
	found := false
	sc := bufio.NewScanner(bytes.NewReader(stat))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 || !strings.HasPrefix(f[0], "cpu") {
			continue
		}
		if f[0] != "cpu" {
			n++
			continue
		}
		found = true
		for i, v := range f[1:] {
			x, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return t, 0, fmt.Errorf("/proc/stat: %q", v)
			}
			if i >= 8 { // guest and guest_nice are already in user and nice
				break
			}
			t.total += x
			if i != 3 && i != 4 { // idle, iowait
				t.busy += x
			}
		}
	}
	if !found {
		return t, 0, fmt.Errorf("/proc/stat has no cpu line")
	}
	return t, n, nil
}

// meminfo reads the fields of /proc/meminfo (in bytes) that metrics use.
func meminfo(b []byte) map[string]uint64 {
	m := map[string]uint64{}
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		x, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			continue
		}
		if len(f) > 1 && f[1] == "kB" {
			x <<= 10
		}
		m[k] = x
	}
	return m
}

func (a *Agent) metrics() (proto.Metrics, error) {
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		return proto.Metrics{}, proto.Errorf(proto.CodeInternal, "read /proc/stat: %v", err)
	}
	cur, n, err := readCPU(stat)
	if err != nil {
		return proto.Metrics{}, proto.Errorf(proto.CodeInternal, "%v", err)
	}
	a.cpuMu.Lock()
	prev := a.cpuPrev
	a.cpuPrev = cur
	a.cpuMu.Unlock()
	out := proto.Metrics{CPUCount: max(n, 1)}
	if cur.total > prev.total && cur.busy >= prev.busy {
		pct := 100 * float64(cur.busy-prev.busy) / float64(cur.total-prev.total)
		out.CPUUsedPct = math.Round(min(pct, 100)*100) / 100
	}
	mem, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return proto.Metrics{}, proto.Errorf(proto.CodeInternal, "read /proc/meminfo: %v", err)
	}
	m := meminfo(mem)
	out.MemTotal, out.MemCache = m["MemTotal"], m["Cached"]+m["SReclaimable"]
	if used := int64(m["MemTotal"]) - int64(m["MemFree"]) - int64(m["Buffers"]) - int64(out.MemCache); used > 0 {
		out.MemUsed = uint64(used)
	}
	out.AgentRSS = selfRSS()
	var st unix.Statfs_t
	if err := unix.Statfs(a.cfg.Root, &st); err == nil {
		out.DiskTotal = st.Blocks * uint64(st.Bsize)
		out.DiskUsed = out.DiskTotal - st.Bavail*uint64(st.Bsize)
	}
	return out, nil
}

// selfRSS is this process's resident memory in bytes (0 if unknown): the
// second field of /proc/self/statm, in pages.
func selfRSS() uint64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return 0
	}
	return pages * uint64(os.Getpagesize())
}
