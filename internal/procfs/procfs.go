// Package procfs reads the few /proc files the host needs (the metrics'
// host gauges, the density bench), one parser for each.
//
// The agent keeps its own copy of the /proc/meminfo parser
// (internal/agent/metrics.go) on purpose: its binary must stay
// byte-identical to the previous release's until that release's suspended
// sandboxes can no longer be upgraded in place (TestUpgradeFromPreviousRelease),
// and importing this package would change it.
package procfs

import (
	"os"
	"strconv"
	"strings"
)

// ParseMemInfo reads the fields of a /proc/meminfo, in bytes ("kB" values
// scaled); lines it cannot read are skipped.
func ParseMemInfo(b []byte) map[string]uint64 {
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

// MemInfo reads this machine's /proc/meminfo.
func MemInfo() (map[string]uint64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return nil, err
	}
	return ParseMemInfo(b), nil
}
