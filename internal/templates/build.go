package templates

import (
	"bufio"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Builder makes a template's root file system in an empty directory.
type Builder func(ctx context.Context, rootfs string, progress io.Writer) error

// Builtin are the templates SPACE can build from Debian packages alone.
var Builtin = map[string]Builder{
	"test": BuildTest,
	"seed": BuildSeed,
}

// SeedPackages are installed into seed:latest on top of Debian's minbase:
// what agents' scripts (and E2B's, whose default template seed:latest
// stands in for) reach for first — a shell, Python with pip and venv
// (`python` too), git, curl, and sudo for the user `user` without a
// password. Recommends are not installed; compilers are not included
// (a template of your own adds them).
var SeedPackages = []string{"bash", "coreutils", "python3", "python-is-python3", "python3-pip", "python3-venv", "git", "curl", "ca-certificates", "procps", "iproute2", "sudo"}

// SourceDateEpoch pins the timestamps mmdebstrap writes, so two builds of the
// same packages produce the same tree.
const SourceDateEpoch = "1700000000"

func findBusybox() (string, error) {
	for _, p := range []string{"/usr/bin/busybox", "/bin/busybox"} {
		f, err := elf.Open(p)
		if err != nil {
			continue
		}
		static := true
		for _, prog := range f.Progs {
			if prog.Type == elf.PT_INTERP {
				static = false
			}
		}
		f.Close()
		if static {
			return p, nil
		}
	}
	return "", errors.New("no static busybox found: install Debian's busybox-static")
}

// BuildTest makes the tiny `test` template: a static busybox with its
// applets, root and a non-root user. It builds in well under a second.
func BuildTest(ctx context.Context, rootfs string, progress io.Writer) error {
	bb, err := findBusybox()
	if err != nil {
		return err
	}
	for _, d := range []string{"bin", "sbin", "usr/bin", "usr/sbin", "etc", "root", "home/user", "proc", "sys", "dev", "run", "var/tmp"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Mkdir(filepath.Join(rootfs, "tmp"), 0o1777); err != nil {
		return err
	}
	os.Chmod(filepath.Join(rootfs, "tmp"), 0o1777)
	os.Chmod(filepath.Join(rootfs, "root"), 0o700)
	if err := copyFile(bb, filepath.Join(rootfs, "bin/busybox"), 0o755); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, bb, "--list").Output()
	if err != nil {
		return fmt.Errorf("list busybox applets: %w", err)
	}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	n := 0
	for sc.Scan() {
		a := strings.TrimSpace(sc.Text())
		if a == "" || a == "busybox" || strings.Contains(a, "/") {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(rootfs, "bin", a)); err != nil && !os.IsExist(err) {
			return err
		}
		n++
	}
	files := map[string]string{
		"etc/passwd":   "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n",
		"etc/group":    "root:x:0:\nuser:x:1000:\n",
		"etc/hostname": "sandbox\n",
		"etc/hosts":    "127.0.0.1 localhost\n::1 localhost\n",
	}
	for p, c := range files {
		if err := os.WriteFile(filepath.Join(rootfs, p), []byte(c), 0o644); err != nil {
			return err
		}
	}
	if err := os.Chown(filepath.Join(rootfs, "home/user"), 1000, 1000); err != nil {
		return err
	}
	fmt.Fprintf(progress, "test: busybox with %d applets\n", n)
	return nil
}

// BuildSeed makes seed:latest: Debian bookworm (minbase) from the host's apt
// sources with mmdebstrap, plus SeedPackages, a non-root user `user`
// (uid 1000) with a home directory who may sudo without a password. Caches
// and logs are removed so the tree depends only on the packages.
func BuildSeed(ctx context.Context, rootfs string, progress io.Writer) error {
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		return errors.New("mmdebstrap is not installed (apt-get install mmdebstrap)")
	}
	// mmdebstrap wants to create the directory itself.
	if err := os.Remove(rootfs); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "mmdebstrap", "--variant=minbase",
		"--include="+strings.Join(SeedPackages, ","),
		`--customize-hook=chroot "$1" useradd -m -u 1000 -U -s /bin/bash user`,
		`--customize-hook=echo 'user ALL=(ALL:ALL) NOPASSWD: ALL' > "$1"/etc/sudoers.d/user && chmod 0440 "$1"/etc/sudoers.d/user`,
		`--customize-hook=rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/log/* "$1"/var/cache/ldconfig/aux-cache "$1"/var/cache/debconf/*-old "$1"/var/lib/dpkg/*-old`,
		`--customize-hook=truncate -s 0 "$1"/etc/machine-id`,
		"bookworm", rootfs)
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH="+SourceDateEpoch)
	cmd.Stdout, cmd.Stderr = progress, progress
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("mmdebstrap: %w", err)
	}
	for _, d := range []string{"proc", "sys", "dev", "run", "tmp"} {
		os.MkdirAll(filepath.Join(rootfs, d), 0o755)
	}
	os.Chmod(filepath.Join(rootfs, "tmp"), 0o1777)
	return nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// Build runs a builtin builder and commits the result as name:latest. A
// failed build leaves nothing behind.
func (s *Store) Build(ctx context.Context, name string, progress io.Writer) (Template, error) {
	b, ok := Builtin[name]
	if !ok {
		return Template{}, fmt.Errorf("no builtin template %q (have test, seed)", name)
	}
	dir, err := s.NewBuild()
	if err != nil {
		return Template{}, err
	}
	if err := b(ctx, filepath.Join(dir, "rootfs"), progress); err != nil {
		s.Discard(dir)
		return Template{}, fmt.Errorf("build %s: %w", name, err)
	}
	return s.Commit(ctx, dir, name, "latest", "builtin:"+name)
}
