// Package procfs reads the few /proc files the host needs (the metrics'
// host gauges, the density bench, the runtimes' look at a process's life
// and at the host's boot), one parser for each.
//
// The agent keeps its own copy of the /proc/meminfo parser
// (internal/agent/metrics.go) on purpose: its binary must stay
// byte-identical to the previous release's until that release's suspended
// sandboxes can no longer be upgraded in place (TestUpgradeFromPreviousRelease),
// and importing this package would change it.
package procfs

import (
	"fmt"
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

// BootID is the id the kernel gave this boot of the host: files written
// but not flushed in another boot may have lost writes with it.
func BootID() (string, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("read the host's boot id: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// Process is what /proc/<pid>/stat says of a process's life.
type Process struct {
	State byte   // R, S, D, Z (zombie), X (dead), …
	Flags uint64 // the kernel's PF_* flags
}

// pfExiting is the kernel's PF_EXITING: the process is tearing down.
const pfExiting = 0x4

// Ending reports whether the process is going away: tearing down after
// its end, a zombie or dead.
func (p Process) Ending() bool { return p.Gone() || p.Flags&pfExiting != 0 }

// Gone reports whether the process holds nothing any more (a zombie or
// dead, waiting only to be reaped).
func (p Process) Gone() bool { return p.State == 'Z' || p.State == 'X' }

// Stat reads /proc/<pid>/stat; an error when there is no such process.
func Stat(pid int) (Process, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Process{}, err
	}
	// After the command's name (which may hold spaces and parentheses):
	// state, ppid, pgrp, session, tty_nr, tpgid, flags.
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if i < 0 || len(f) < 7 || len(f[0]) != 1 {
		return Process{}, fmt.Errorf("/proc/%d/stat: unreadable", pid)
	}
	flags, err := strconv.ParseUint(f[6], 10, 64)
	if err != nil {
		return Process{}, fmt.Errorf("/proc/%d/stat: flags: %w", pid, err)
	}
	return Process{State: f[0][0], Flags: flags}, nil
}

// KillPending reports whether process pid has a SIGKILL it has not acted on
// yet: kill(2) returns before the process runs to take it, and until then
// /proc/<pid>/stat shows it as it was. Such a process is ending all the same.
func KillPending(pid int) (bool, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false, err
	}
	return killPending(b), nil
}

// killPending reads a /proc/<pid>/status: SIGKILL (signal 9, bit 8) in the
// signals pending for the thread (SigPnd) or the whole process (ShdPnd).
func killPending(status []byte) bool {
	for line := range strings.SplitSeq(string(status), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "SigPnd" && k != "ShdPnd") {
			continue
		}
		if mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64); err == nil && mask&(1<<8) != 0 {
			return true
		}
	}
	return false
}
