//go:build linux

package gvisor

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// A fork's save (ephemeral: its copies load it and the fork removes it) is
// written through the page cache when the sandbox's memory cgroup has room
// for it, and read from there; a save written around the cache (O_DIRECT,
// lifecycle.go's checkpoint) is read around it too, since a buffered read
// would charge a second copy of the image to the reader's cgroup.

// cachedMark, in a save, says its pages file was written through the page
// cache.
const cachedMark = "cached"

// markCached records in a complete save dir that it was written through the
// page cache.
func markCached(dir string) error {
	return os.WriteFile(filepath.Join(dir, cachedMark), nil, 0o600)
}

// cachedSave reports whether the save in dir was written through the page
// cache (and is to be read from there).
func cachedSave(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, cachedMark))
	return err == nil
}

// roomInCache reports whether sandbox id's memory cgroup can take a save of
// the sandbox as page cache: the page cache a save writes is charged to the
// sandbox's cgroup, beside what it holds. A sandbox with 420 MiB of its 512
// MiB in use was pushed to its limit by it (the kernel wrote the cache out
// and reclaimed under the running sandbox: forks 962–1,254 ms against
// 832–952 with O_DIRECT), so such a save, or one whose cgroup cannot be
// read, is written around the cache.
func roomInCache(id string) bool {
	for _, dir := range []string{filepath.Join("/sys/fs/cgroup/space", id), filepath.Join("/sys/fs/cgroup/memory/space", id)} {
		if _, err := os.Stat(dir); err == nil {
			return cgroupHasRoom(dir)
		}
	}
	return false
}

// cgroupHasRoom reads the memory cgroup dir (v2 or v1): its usage, plus its
// shared memory (gVisor's memory file, what a save writes), plus an eighth
// of its limit to spare, within the limit.
func cgroupHasRoom(dir string) bool {
	read := func(names ...string) (uint64, bool) {
		for _, n := range names {
			b, err := os.ReadFile(filepath.Join(dir, n))
			if err != nil {
				continue
			}
			s := strings.TrimSpace(string(b))
			if s == "max" {
				return 1 << 62, true
			}
			v, err := strconv.ParseUint(s, 10, 64)
			return v, err == nil
		}
		return 0, false
	}
	usage, ok1 := read("memory.current", "memory.usage_in_bytes")
	limit, ok2 := read("memory.max", "memory.limit_in_bytes")
	stat, err := os.ReadFile(filepath.Join(dir, "memory.stat"))
	if !ok1 || !ok2 || err != nil {
		return false
	}
	shmem, found := uint64(0), false
	for line := range strings.SplitSeq(string(stat), "\n") {
		if v, ok := strings.CutPrefix(line, "shmem "); ok {
			shmem, err = strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			found = err == nil
			break
		}
	}
	return found && usage+shmem <= limit-limit/8
}
