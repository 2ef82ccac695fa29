//go:build linux

package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spacesandbox/space/internal/runtime"
)

// cpuPeriod is the CFS period of every sandbox's CPU limit (100 ms).
const cpuPeriod = 100000

// A restore is host work done before the sandbox's processes run again:
// the sentry boots, builds its seccomp filter and loads the kernel's state
// and memory. Under the sandbox's CPU limit (one vCPU is a tenth of a
// second per tenth of a second) that work queues behind itself — on a
// two-core host a restore of 200 MiB took 300–400 ms under the limit and
// 240–270 ms without it. So a restore runs from a bundle without the CPU
// limit, and the limit is put on the sandbox's cgroup as soon as runsc
// returns (the sandbox's processes run from then: about a millisecond
// without it), before the agent is waited for. Memory and pid limits stay
// in the bundle. The kernel keeps the CPU count it was
// checkpointed with (runsc derives it from the limit only at first boot).

// restore runs `runsc restore` of image as spec's sandbox (its pid written
// to pidFile unless empty) and puts the CPU limit on it.
func (r *Runtime) restore(ctx context.Context, spec runtime.Spec, image, pidFile string) error {
	id := spec.SandboxID
	bundle, err := r.restoreBundle(id)
	if err != nil {
		return err
	}
	args := []string{"restore", "--detach", "--background"}
	if r.direct && !cachedSave(image) {
		args = append(args, "--direct") // as checkpoint writes it (lifecycle.go)
	}
	if pidFile != "" {
		args = append(args, "--pid-file", pidFile)
	}
	if err := r.start(ctx, spec, append(args, "--image-path", image, "--bundle", bundle, id)...); err != nil {
		return err
	}
	if err := limitCPU(id, spec.Resources.VCPUs); err != nil {
		// Never left running without its limit.
		r.runsc(context.WithoutCancel(ctx), spec, "delete", "--force", id)
		return fmt.Errorf("restore %s: limit its CPU: %w", id, err)
	}
	return nil
}

// restoreBundle writes the sandbox's bundle without its CPU limit beside
// the bundle and returns its directory.
func (r *Runtime) restoreBundle(id string) (string, error) {
	b, err := os.ReadFile(filepath.Join(r.bundleDir(id), "config.json"))
	if err != nil {
		return "", fmt.Errorf("read bundle: %w", err)
	}
	var spec map[string]any
	if err := json.Unmarshal(b, &spec); err != nil {
		return "", fmt.Errorf("decode bundle: %w", err)
	}
	if linux, ok := spec["linux"].(map[string]any); ok {
		if res, ok := linux["resources"].(map[string]any); ok {
			delete(res, "cpu")
		}
	}
	if b, err = json.Marshal(spec); err != nil {
		return "", err
	}
	dir := r.bundleDir(id) + "-restore"
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	return dir, replaceFile(filepath.Join(dir, "config.json"), b)
}

// limitCPU puts vcpus' worth of CPU time per period on the sandbox's
// cgroup (v2 cpu.max, or v1 cpu.cfs_quota_us). A host without the CPU
// controller has no limit to put, as for runsc at create.
func limitCPU(id string, vcpus int) error {
	if vcpus < 1 {
		vcpus = 1
	}
	quota := int64(vcpus) * cpuPeriod
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		f := filepath.Join("/sys/fs/cgroup/space", id, "cpu.max")
		if _, err := os.Stat(f); errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return os.WriteFile(f, fmt.Appendf(nil, "%d %d", quota, cpuPeriod), 0)
	}
	dir := filepath.Join("/sys/fs/cgroup/cpu/space", id)
	if _, err := os.Stat(filepath.Join(dir, "cpu.cfs_quota_us")); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := os.WriteFile(filepath.Join(dir, "cpu.cfs_period_us"), fmt.Appendf(nil, "%d", cpuPeriod), 0); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "cpu.cfs_quota_us"), fmt.Appendf(nil, "%d", quota), 0)
}
