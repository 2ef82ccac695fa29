package agent

import (
	"errors"
	"os"
	"strconv"
	"syscall"
	"unsafe"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/agent/proto"
)

// configure applies a host's Configure: hostname, clock and entropy. The
// hostname and clock belong to the sandbox only when the agent is its init
// (PID 1); an agent run as a plain host process (tests) leaves them alone.
func configure(c proto.Configure, entropy []byte) error {
	if os.Getpid() != 1 {
		c.Hostname, c.UnixNano = "", 0
	}
	if c.Hostname != "" {
		if len(c.Hostname) > 64 {
			return proto.Errorf(proto.CodeInvalidArgument, "hostname longer than 64 bytes")
		}
		if err := unix.Sethostname([]byte(c.Hostname)); err != nil {
			return proto.Errorf(proto.CodePermissionDenied, "set hostname: %v", err)
		}
		if err := writeHosts(c.Hostname); err != nil {
			return proto.Errorf(proto.CodeInternal, "write /etc/hosts: %v", err)
		}
	}
	if c.Network != nil && os.Getpid() == 1 {
		if err := configureNetwork(*c.Network); err != nil {
			return proto.Errorf(proto.CodeInternal, "configure network: %v", err)
		}
	}
	if c.CPUs > 0 && os.Getpid() == 1 {
		if err := limitCPUs(c.CPUs); err != nil {
			return proto.Errorf(proto.CodeInternal, "limit CPUs: %v", err)
		}
	}
	if c.UnixNano != 0 {
		tv := unix.NsecToTimeval(c.UnixNano)
		// A user-space kernel such as gVisor takes its time from the host
		// and does not implement settimeofday: nothing to correct there.
		if err := unix.Settimeofday(&tv); err != nil && !errors.Is(err, unix.ENOSYS) {
			return proto.Errorf(proto.CodePermissionDenied, "set clock: %v", err)
		}
	}
	if len(entropy) > 0 {
		if err := addEntropy(entropy); err != nil {
			return proto.Errorf(proto.CodeInternal, "reseed RNG: %v", err)
		}
	}
	return nil
}

// limitCPUs lets the agent's threads, and so every process it starts from
// now on (a child inherits its parent thread's affinity), run on the first
// n of the CPUs they may use, when there are more. gVisor shows a sandbox at
// least two CPUs whatever its CPU quota (runsc floors the count at 2), so a
// 1-vCPU sandbox's nproc, Go's NumCPU, Node's availableParallelism and
// make -j$(nproc) saw two and oversubscribed the one CPU's time it has; they
// read the affinity. The kernel's own count (/proc/cpuinfo) stays as it is.
func limitCPUs(n int) error {
	var cur unix.CPUSet
	if err := unix.SchedGetaffinity(0, &cur); err != nil {
		return err
	}
	if cur.Count() <= n {
		return nil
	}
	var want unix.CPUSet
	for cpu, k := 0, 0; k < n && cpu < 8*int(unsafe.Sizeof(cur)); cpu++ {
		if cur.IsSet(cpu) {
			want.Set(cpu)
			k++
		}
	}
	// Every thread: a thread the runtime starts meanwhile inherits the
	// affinity of the one starting it, so passes repeat until one finds
	// nothing left to change.
	for pass := 0; pass < 5; pass++ {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return err
		}
		changed := false
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			var got unix.CPUSet
			if unix.SchedGetaffinity(tid, &got) == nil && got == want {
				continue
			}
			if err := unix.SchedSetaffinity(tid, &want); err != nil && !errors.Is(err, unix.ESRCH) {
				return err
			}
			changed = true
		}
		if !changed {
			return nil
		}
	}
	return nil
}

// addEntropy mixes bytes into the kernel pool and credits them
// (RNDADDENTROPY), so the guest's RNG diverges from every other copy of the
// same snapshot. Without the privilege to credit, the bytes are still mixed
// in by a plain write.
func addEntropy(b []byte) error {
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if len(b) > 512 {
		b = b[:512]
	}
	buf := make([]byte, 8+len(b))
	*(*int32)(unsafe.Pointer(&buf[0])) = int32(len(b) * 8) // entropy_count (bits)
	*(*int32)(unsafe.Pointer(&buf[4])) = int32(len(b))     // buf_size
	copy(buf[8:], b)
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&buf[0])))
	if errno != 0 {
		_, err = f.Write(b)
		return err
	}
	return nil
}

func syncFilesystems() { unix.Sync() }

func (a *Agent) resize(r proto.ResizeRequest) error {
	p, err := a.lookup(r.ID)
	if err != nil {
		return err
	}
	p.mu.Lock()
	ptmx := p.ptmx
	p.mu.Unlock()
	if ptmx == nil {
		return proto.Errorf(proto.CodeFailedPrecondition, "process %s has no terminal", r.ID)
	}
	if r.Cols == 0 || r.Rows == 0 {
		return proto.Errorf(proto.CodeInvalidArgument, "cols and rows must be positive")
	}
	if err := pty.Setsize(ptmx, &pty.Winsize{Cols: r.Cols, Rows: r.Rows}); err != nil {
		return proto.Errorf(proto.CodeInternal, "resize: %v", err)
	}
	return nil
}
