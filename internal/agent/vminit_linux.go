package agent

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// VM boot. In a microVM the agent is /init of the initramfs the vm runtime
// builds: it loads the virtio modules listed in /modules/order, mounts the
// sandbox's disk (/dev/vda, ext4) and makes it the root, then carries on as
// the sandbox's PID 1. The initramfs files are freed by the switch; the
// running agent keeps its own image.

// VMBoot switches a microVM from its initramfs to the sandbox's disk and
// returns the device of the virtio-serial port named port.
func VMBoot(port string) (string, error) {
	if err := os.MkdirAll("/dev", 0o755); err != nil {
		return "", err
	}
	if !mounted("/dev") {
		if err := unix.Mount("devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755"); err != nil && !errors.Is(err, unix.EBUSY) {
			return "", fmt.Errorf("mount /dev: %w", err)
		}
	}
	for _, m := range [][3]string{{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}} {
		os.MkdirAll(m[1], 0o755)
		if err := unix.Mount(m[0], m[1], m[2], 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return "", fmt.Errorf("mount %s: %w", m[1], err)
		}
	}
	if err := applyCmdline(); err != nil {
		return "", err
	}
	if err := loadModules("/modules"); err != nil {
		return "", err
	}
	if err := waitFor("/dev/vda", 10*time.Second); err != nil {
		return "", err
	}
	os.MkdirAll("/newroot", 0o755)
	if err := unix.Mount("/dev/vda", "/newroot", "ext4", 0, ""); err != nil {
		return "", fmt.Errorf("mount the sandbox disk: %w", err)
	}
	dev, err := findPort(port, 10*time.Second)
	if err != nil {
		return "", err
	}
	// Move the pseudo file systems under the new root, then make it /.
	for _, d := range []string{"/dev", "/proc", "/sys"} {
		os.MkdirAll("/newroot"+d, 0o755)
		if err := unix.Mount(d, "/newroot"+d, "", unix.MS_MOVE, ""); err != nil {
			return "", fmt.Errorf("move %s: %w", d, err)
		}
	}
	clearInitramfs()
	if err := os.Chdir("/newroot"); err != nil {
		return "", err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return "", fmt.Errorf("switch root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return "", fmt.Errorf("chroot: %w", err)
	}
	if err := os.Chdir("/"); err != nil {
		return "", err
	}
	if workdir != "" {
		os.Chdir(workdir) // processes start there unless told otherwise
	}
	return dev, nil
}

// loadModules loads the modules dir/order lists, in order.
func loadModules(dir string) error {
	f, err := os.Open(filepath.Join(dir, "order"))
	if errors.Is(err, os.ErrNotExist) {
		return nil // a kernel with the drivers built in
	}
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name := strings.TrimSpace(sc.Text())
		if name == "" {
			continue
		}
		m, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		err = unix.FinitModule(int(m.Fd()), "", 0)
		m.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("load module %s: %w", name, err)
		}
	}
	return sc.Err()
}

func waitFor(path string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not appear within %s", path, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// findPort finds the device of the virtio-serial port called name (udev
// would link it as /dev/virtio-ports/<name>; there is no udev here).
func findPort(name string, d time.Duration) (string, error) {
	deadline := time.Now().Add(d)
	for {
		ports, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
		for _, p := range ports {
			if b, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(b)) == name {
				dev := "/dev/" + filepath.Base(filepath.Dir(p))
				if _, err := os.Stat(dev); err == nil {
					return dev, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("virtio-serial port %q did not appear within %s", name, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// clearInitramfs frees the initramfs's files (the agent keeps running from
// its mapped image).
func clearInitramfs() {
	entries, _ := os.ReadDir("/")
	for _, e := range entries {
		switch e.Name() {
		case "newroot", "dev", "proc", "sys":
			continue
		}
		os.RemoveAll("/" + e.Name())
	}
}

// applyCmdline takes the sandbox's environment and working directory from
// the kernel command line: space.env=<base64url JSON object>,
// space.workdir=<base64url path>.
// workdir is the template's working directory (from the command line).
var workdir string

func applyCmdline() error {
	b, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return err
	}
	for _, f := range strings.Fields(string(b)) {
		k, v, ok := strings.Cut(f, "=")
		if !ok || (k != "space.env" && k != "space.workdir") {
			continue
		}
		raw, err := base64.RawURLEncoding.DecodeString(v)
		if err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
		if k == "space.workdir" {
			workdir = string(raw)
			continue
		}
		var env map[string]string
		if err := json.Unmarshal(raw, &env); err != nil {
			return fmt.Errorf("space.env: %w", err)
		}
		for ek, ev := range env {
			os.Setenv(ek, ev)
		}
	}
	return nil
}
