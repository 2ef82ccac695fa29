//go:build linux

package gvisor

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/spacesandbox/space/internal/runtime"
)

// Paths inside every sandbox.
const (
	AgentPath = "/.space/agent" // the agent binary, read-only
	RunDir    = "/.space/run"   // the host's agent socket lives here
	SudoPath  = "/usr/bin/sudo" // replaced by the agent's sudo helper when the template has it
)

// ociSpec is the OCI runtime spec of a sandbox: the agent as init, the
// template as root (writes go to gVisor's overlay), cgroup limits for CPU,
// memory and pids, and the sandbox's network namespace.
func (r *Runtime) ociSpec(spec runtime.Spec, rootfs, agent string) map[string]any {
	// The agent's environment and working directory are what its commands
	// inherit: defaults, then the template's, then the sandbox's.
	merged := map[string]string{"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
	tplEnv, workdir := r.cfg.Templates.Config(spec.Template.Digest)
	for k, v := range tplEnv {
		merged[k] = v
	}
	for k, v := range spec.Env {
		merged[k] = v
	}
	keys := make([]string, 0, len(merged))
	for k := range merged {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	env := make([]string, 0, len(keys))
	for _, k := range keys {
		env = append(env, k+"="+merged[k])
	}
	cwd := "/"
	if workdir != "" {
		if fi, err := os.Stat(filepath.Join(rootfs, workdir)); err == nil && fi.IsDir() {
			cwd = workdir
		}
	}
	res := spec.Resources
	args := []string{AgentPath, "--connect", "unix:" + RunDir + "/agent.sock"}
	if agent == "" { // a Bare sandbox (bare.go): no agent
		args = []string{"/bin/sleep", "infinity"}
	}
	mounts := []map[string]any{
		{"destination": "/proc", "type": "proc", "source": "proc"},
		{"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": []string{"nosuid", "noexec", "nodev", "ro"}},
		{"destination": "/run", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "nodev", "mode=755"}},
		// Read-only: the agent only connects to the socket in it (a
		// connect needs no write access to a mount); nothing the sandbox
		// writes may land on the host outside its disk limit (#14 item 1).
		{"destination": RunDir, "type": "bind", "source": r.socketDir(spec.SandboxID), "options": []string{"rbind", "ro"}},
	}
	if agent != "" { // before the socket directory, as saves made so far expect
		mounts = slices.Insert(mounts, len(mounts)-1, map[string]any{"destination": AgentPath, "type": "bind", "source": agent, "options": []string{"rbind", "ro"}})
	}
	// gVisor does not honour setuid bits, so a template's sudo cannot work;
	// the agent serves it instead (internal/agent/sudo.go), following the
	// template's sudoers.
	if fi, err := os.Lstat(filepath.Join(rootfs, SudoPath)); err == nil && fi.Mode().IsRegular() && agent != "" {
		args = append(args, "--sudo")
		mounts = append(mounts, map[string]any{"destination": SudoPath, "type": "bind", "source": agent, "options": []string{"rbind", "ro"}})
	}
	return map[string]any{
		"ociVersion": "1.0.2",
		"process": map[string]any{
			"terminal": false,
			"user":     map[string]any{"uid": 0, "gid": 0},
			"args":     args,
			"env":      env,
			"cwd":      cwd,
			"capabilities": func() map[string]any {
				caps := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETGID", "CAP_SETUID",
					"CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_MKNOD", "CAP_AUDIT_WRITE", "CAP_SETFCAP",
					"CAP_SYS_ADMIN", "CAP_SYS_TIME", "CAP_NET_ADMIN", "CAP_SYS_PTRACE"}
				return map[string]any{"bounding": caps, "effective": caps, "permitted": caps}
			}(),
			"rlimits":         []map[string]any{{"type": "RLIMIT_NOFILE", "hard": 1048576, "soft": 1048576}},
			"noNewPrivileges": false,
		},
		"root":     map[string]any{"path": rootfs, "readonly": false},
		"hostname": hostname(spec.SandboxID),
		"mounts":   mounts,
		"linux": map[string]any{
			"cgroupsPath": "/space/" + spec.SandboxID,
			"resources": map[string]any{
				"cpu":    map[string]any{"quota": int64(res.VCPUs) * cpuPeriod, "period": cpuPeriod},
				"memory": map[string]any{"limit": int64(res.MemoryMiB) << 20},
				"pids":   map[string]any{"limit": 4096},
			},
			"namespaces": []map[string]any{{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, netns(spec)},
		},
	}
}

// netns is the sandbox's network namespace: its own (made by the network)
// or a new empty one.
func netns(spec runtime.Spec) map[string]any {
	if spec.Net != nil && spec.Net.Netns != "" {
		return map[string]any{"type": "network", "path": spec.Net.Netns}
	}
	return map[string]any{"type": "network"}
}

func hostname(id string) string {
	const prefix = "sbx_"
	if len(id) > len(prefix)+12 {
		return "sbx-" + id[len(prefix):len(prefix)+12]
	}
	return "sandbox"
}

// writeBundle writes the sandbox's config.json.
func (r *Runtime) writeBundle(spec runtime.Spec, rootfs, agent string) error {
	dir := r.bundleDir(spec.SandboxID)
	for _, d := range []string{dir, r.upperDir(spec.SandboxID), r.socketDir(spec.SandboxID)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	b, err := json.MarshalIndent(r.ociSpec(spec, rootfs, agent), "", " ")
	if err != nil {
		return err
	}
	return replaceFile(filepath.Join(dir, "config.json"), b)
}
