//go:build linux

package vm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/spacesandbox/space/internal/sandbox"
)

// Each VM's QEMU runs in its own cgroup: memory bounded by the guest's RAM
// plus QEMU's overhead, CPU by its vCPUs, pids bounded. cgroup v2 when the
// unified hierarchy is mounted, else the v1 memory, cpu and pids
// controllers.

const cgroupRoot = "/sys/fs/cgroup"

// qemuOverheadMiB is what QEMU itself may use beside guest RAM.
const qemuOverheadMiB = 256

func cgroupV2() bool {
	_, err := os.Stat(filepath.Join(cgroupRoot, "cgroup.controllers"))
	return err == nil
}

func cgroupDirs(id string) map[string]string {
	name := filepath.Join("space-vm", id)
	if cgroupV2() {
		return map[string]string{"": filepath.Join(cgroupRoot, name)}
	}
	return map[string]string{
		"memory": filepath.Join(cgroupRoot, "memory", name),
		"cpu":    filepath.Join(cgroupRoot, "cpu", name),
		"pids":   filepath.Join(cgroupRoot, "pids", name),
	}
}

func joinCgroup(id string, pid int, res sandbox.Resources) error {
	memLimit := strconv.FormatInt(int64(res.MemoryMiB+qemuOverheadMiB)<<20, 10)
	quota := strconv.Itoa(res.VCPUs * 100000)
	var errs []error
	for ctrl, dir := range cgroupDirs(id) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			errs = append(errs, err)
			continue
		}
		files := map[string]string{}
		switch ctrl {
		case "":
			files = map[string]string{"memory.max": memLimit, "cpu.max": quota + " 100000", "pids.max": "1024"}
		case "memory":
			files["memory.limit_in_bytes"] = memLimit
		case "cpu":
			files["cpu.cfs_period_us"], files["cpu.cfs_quota_us"] = "100000", quota
		case "pids":
			files["pids.max"] = "1024"
		}
		for f, v := range files {
			if err := os.WriteFile(filepath.Join(dir, f), []byte(v), 0o644); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", f, err))
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeCgroup removes the VM's cgroups; they empty once QEMU's process is
// reaped, a moment after it exits.
func removeCgroup(id string) error {
	end := time.Now().Add(2 * time.Second)
	for {
		var err error
		for _, dir := range cgroupDirs(id) {
			if e := os.Remove(dir); e != nil && !os.IsNotExist(e) {
				err = e
			}
		}
		if err == nil {
			return nil
		}
		if time.Now().After(end) {
			return fmt.Errorf("remove cgroup: %w", err)
		}
		time.Sleep(time.Millisecond)
	}
}
