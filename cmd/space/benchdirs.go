package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/procfs"
)

// benchDirPrefix names the directories `space bench --baseline` runs its
// bare runtime in, under the server's runtime directory.
const benchDirPrefix = "bench-bare-"

// benchLocks holds the lock of each bare directory this process made, for
// as long as it lives (an unreferenced *os.File would be closed by the
// garbage collector, and its lock with it).
var benchLocks []*os.File

// newBenchDir makes a directory for a bare runtime under rtDir and locks it
// for as long as this process lives: however the bench ends, the lock goes
// with it. First it clears what benches that were killed left behind
// (clearBenchDir) — the directories of theirs no live process locks.
func newBenchDir(rtDir string) (string, error) {
	clearKilledBenches(rtDir)
	dir, err := os.MkdirTemp(rtDir, benchDirPrefix)
	if err != nil {
		return "", err
	}
	f, err := os.Open(dir)
	if err == nil {
		if err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
		}
	}
	if err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("lock %s: %w", dir, err)
	}
	benchLocks = append(benchLocks, f)
	return dir, nil
}

// clearKilledBenches clears every bare directory under rtDir that no live
// bench locks (best effort: what cannot be cleared is said on stderr and
// left for the next bench). A bench of a release before these locks would
// be taken for killed: run one bench per server at a time.
func clearKilledBenches(rtDir string) {
	dirs, _ := filepath.Glob(filepath.Join(rtDir, benchDirPrefix+"*"))
	for _, dir := range dirs {
		f, err := os.Open(dir)
		if err != nil {
			continue
		}
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
			if err := clearBenchDir(dir); err != nil {
				fmt.Fprintf(os.Stderr, "space bench: what a killed bench left in %s stays: %v\n", dir, err)
			}
		}
		f.Close()
	}
}

// clearBenchDir ends what a killed bench left running from dir (runsc's
// sandbox and gofer, QEMU: processes whose command line names a path in
// it), unmounts what it left mounted there (gVisor's network namespace
// pins) and removes it.
func clearBenchDir(dir string) error {
	killed := killNaming(dir + "/")
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		alive := 0
		for _, pid := range killed {
			if p, err := procfs.Stat(pid); err == nil && !p.Gone() {
				alive++
			}
		}
		if alive == 0 {
			break
		}
	}
	for _, m := range mountsUnder(dir + "/") {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
			return fmt.Errorf("unmount %s: %w", m, err)
		}
	}
	return os.RemoveAll(dir)
}

// killNaming sends SIGKILL to every process whose command line holds
// prefix, and returns them.
func killNaming(prefix string) []int {
	var killed []int
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(b, []byte(prefix)) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if err != nil || pid == os.Getpid() {
			continue
		}
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			killed = append(killed, pid)
		}
	}
	return killed
}

// mountsUnder lists this mount namespace's mount points under prefix,
// deepest first.
func mountsUnder(prefix string) []string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		// The mount point, with mountinfo's octal escapes (\040 …) undone.
		mp := f[4]
		if strings.Contains(mp, `\`) {
			if s, err := strconv.Unquote(`"` + strings.ReplaceAll(mp, `"`, `\"`) + `"`); err == nil {
				mp = s
			}
		}
		if strings.HasPrefix(mp, prefix) {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}
