//go:build linux

package vm

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// probeAccel decides between KVM and TCG: KVM when /dev/kvm exists and a
// probe VM boots this kernel and initramfs to the agent under it within a
// few seconds (some hosts expose /dev/kvm yet cannot run a stock guest,
// e.g. PVM hosts), TCG otherwise. The answer is kept for this host boot.
func (r *Runtime) probeAccel(ctx context.Context) (string, string) {
	if _, err := os.Stat("/dev/kvm"); err != nil {
		return "tcg", "/dev/kvm is absent"
	}
	cache := "/run/space-vm-accel.json" // per host boot
	key := cacheKey(r.cfg.QEMU, r.cfg.Kernel)
	var c struct{ Key, Accel, Why string }
	if b, err := os.ReadFile(cache); err == nil && json.Unmarshal(b, &c) == nil && c.Key == key {
		return c.Accel, c.Why + " (probed earlier this boot)"
	}
	accel, why := "tcg", ""
	if err := r.probeKVM(ctx); err != nil {
		why = "/dev/kvm exists but a probe guest did not boot under KVM: " + err.Error()
	} else {
		accel, why = "kvm", "a probe guest booted under KVM"
	}
	b, _ := json.Marshal(struct{ Key, Accel, Why string }{key, accel, why})
	os.WriteFile(cache, b, 0o600)
	return accel, why
}

func cacheKey(paths ...string) string {
	var sb strings.Builder
	for _, p := range paths {
		if fi, err := os.Stat(p); err == nil {
			fmt.Fprintf(&sb, "%s:%d:%d;", p, fi.Size(), fi.ModTime().UnixNano())
		}
	}
	return sb.String()
}

// probeKVM boots the kernel and initramfs (no disk) under KVM and waits for
// the kernel to hand over to /init, which then reports the missing disk.
func (r *Runtime) probeKVM(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 8*time.Second)
	defer cancel()
	dir, err := os.MkdirTemp("", "space-kvm-probe")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	console := filepath.Join(dir, "console.log")
	cmd := exec.CommandContext(ctx, r.cfg.QEMU, "-M", "microvm", "-accel", "kvm", "-cpu", "host", "-m", "256M",
		"-kernel", r.cfg.Kernel, "-initrd", r.initramfs, "-append", "console=ttyS0 panic=-1",
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot", "-serial", "file:"+console)
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	for ctx.Err() == nil {
		if b, _ := os.ReadFile(console); strings.Contains(string(b), "Run /init as init process") || strings.Contains(string(b), "space-agent") {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("no sign of the guest within 8s")
}
