//go:build linux

package gvisor

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// A save goes through the page cache while the cgroup's usage plus its
// shared memory stays within a quarter of its limit over the limit; v2 and
// v1 files are read alike, "max" is no limit, and a cgroup that cannot be
// read is not used (the save goes around the cache).
func TestCgroupHasRoom(t *testing.T) {
	const mib = 1 << 20
	write := func(t *testing.T, files map[string]string) string {
		dir := t.TempDir()
		for name, v := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(v), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	stat := func(shmem int) string { return "cache 1\nrss 2\nshmem " + itoa(shmem) + "\nmapped_file 3\n" }
	for _, c := range []struct {
		name  string
		files map[string]string
		want  bool
	}{
		{"v1, 200 MiB dirty of 512", map[string]string{"memory.usage_in_bytes": itoa(233 * mib), "memory.limit_in_bytes": itoa(512 * mib), "memory.stat": stat(203 * mib)}, true},
		{"v1, 280 MiB dirty of 512", map[string]string{"memory.usage_in_bytes": itoa(310 * mib), "memory.limit_in_bytes": itoa(512 * mib), "memory.stat": stat(284 * mib)}, true},
		{"v1, a quarter over exactly", map[string]string{"memory.usage_in_bytes": itoa(340 * mib), "memory.limit_in_bytes": itoa(512 * mib), "memory.stat": stat(300 * mib)}, true},
		{"v1, just over a quarter over", map[string]string{"memory.usage_in_bytes": itoa(340 * mib), "memory.limit_in_bytes": itoa(512 * mib), "memory.stat": stat(301 * mib)}, false},
		{"v1, 420 MiB dirty of 512", map[string]string{"memory.usage_in_bytes": itoa(465 * mib), "memory.limit_in_bytes": itoa(512 * mib), "memory.stat": stat(420 * mib)}, false},
		{"v2, room", map[string]string{"memory.current": itoa(100 * mib), "memory.max": itoa(1024 * mib), "memory.stat": "anon 5\nshmem " + itoa(80*mib) + "\n"}, true},
		{"v2, no limit", map[string]string{"memory.current": itoa(8000 * mib), "memory.max": "max\n", "memory.stat": stat(7000 * mib)}, true},
		{"no shmem line", map[string]string{"memory.current": itoa(mib), "memory.max": itoa(512 * mib), "memory.stat": "anon 5\n"}, false},
		{"no usage", map[string]string{"memory.max": itoa(512 * mib), "memory.stat": stat(mib)}, false},
		{"unreadable limit", map[string]string{"memory.current": itoa(mib), "memory.max": "lots", "memory.stat": stat(mib)}, false},
	} {
		m, ok := readCgroupMemory(write(t, c.files))
		if got := ok && m.roomForSave(); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	if _, ok := readCgroupMemory(filepath.Join(t.TempDir(), "absent")); ok {
		t.Error("a cgroup that is not there was read")
	}
	if _, ok := sandboxMemory("sbx_nosuchsandboxanywhere00000000"); ok {
		t.Error("a sandbox without a cgroup was read")
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
