package agent

import (
	"errors"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// InitSystem does what PID 1 must: mount the pseudo file systems a Linux
// userland expects and set the hostname. Mounts that already exist (a
// container runtime made them) are left alone. Only call it as PID 1.
func InitSystem(hostname string) []error {
	var errs []error
	mounts := []struct {
		src, dst, fstype string
		flags            uintptr
		data             string
	}{
		{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"sysfs", "/sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755"},
		{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"},
		{"tmpfs", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
		{"tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
		{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755"},
	}
	// One look at the mount table, not one per mount: under gVisor every
	// read of /proc/self/mountinfo is a few trapped syscalls, and this runs
	// before the agent can answer its host (a create waits for it).
	have := mountPoints()
	for _, m := range mounts {
		if have[m.dst] {
			continue
		}
		if err := os.MkdirAll(m.dst, 0o755); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := unix.Mount(m.src, m.dst, m.fstype, m.flags, m.data); err != nil && !errors.Is(err, unix.EBUSY) {
			errs = append(errs, &os.PathError{Op: "mount " + m.fstype, Path: m.dst, Err: err})
		} else if m.dst == "/proc" {
			have = mountPoints() // readable now: what the kernel mounted itself
		}
	}
	if _, err := os.Lstat("/dev/ptmx"); err != nil {
		os.Symlink("pts/ptmx", "/dev/ptmx")
	}
	for _, l := range [][2]string{{"/proc/self/fd", "/dev/fd"}, {"/proc/self/fd/0", "/dev/stdin"}, {"/proc/self/fd/1", "/dev/stdout"}, {"/proc/self/fd/2", "/dev/stderr"}} {
		if _, err := os.Lstat(l[1]); err != nil {
			os.Symlink(l[0], l[1])
		}
	}
	if hostname != "" {
		if err := unix.Sethostname([]byte(hostname)); err != nil {
			errs = append(errs, err)
		}
	}
	// The loopback interface is brought up by the runtime when it gives the
	// sandbox a network; nothing else is started here.
	syscall.Umask(0o022)
	return errs
}

// mounted reports whether dir is a mount point.
func mounted(dir string) bool { return mountPoints()[dir] }

// mountPoints are the mount points /proc/self/mountinfo lists (none when
// it cannot be read: before /proc is mounted).
func mountPoints() map[string]bool {
	have := map[string]bool{}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return have
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 {
			have[f[4]] = true
		}
	}
	return have
}
