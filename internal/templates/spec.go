package templates

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/spacesandbox/space/internal/errdefs"
)

// Spec describes a custom template: a base template plus Debian packages
// and files. The same spec on the same base and package archive yields the
// same digest.
type Spec struct {
	Name     string            `json:"name"`
	Tag      string            `json:"tag,omitempty"`
	Base     string            `json:"base"`
	Packages []string          `json:"packages,omitempty"`
	Files    []File            `json:"files,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	Workdir  string            `json:"workdir,omitempty"`
	// StartCommand would run before the template is snapshotted; template
	// snapshots do not exist yet, so it is refused rather than ignored.
	StartCommand []string `json:"start_command,omitempty"`
}

// File is a file placed into a template.
type File struct {
	Path    string `json:"path"`
	Content string `json:"content"` // base64
	Mode    string `json:"mode,omitempty"`
}

var pkgRE = regexp.MustCompile(`^[a-z0-9][a-z0-9+.\-]{0,127}(=[A-Za-z0-9.+~:\-]{1,64})?$`)
var envKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// Validate checks a spec, filling defaults. Errors are InvalidArgument.
func (s *Spec) Validate() error {
	bad := func(field, format string, a ...any) error {
		return errdefs.New(errdefs.InvalidArgument, "%s: %s", field, fmt.Sprintf(format, a...)).WithDetails(map[string]any{"field": field})
	}
	if s.Tag == "" {
		s.Tag = "latest"
	}
	if !nameRE.MatchString(s.Name) {
		return bad("name", "lowercase letters, digits, '.', '_' and '-', starting with a letter or digit")
	}
	if !tagRE.MatchString(s.Tag) {
		return bad("tag", "letters, digits, '.', '_' and '-'")
	}
	if s.Base == "" {
		return bad("base", "required, like seed:latest")
	}
	if len(s.Packages) > 256 {
		return bad("packages", "at most 256")
	}
	for _, p := range s.Packages {
		if !pkgRE.MatchString(p) {
			return bad("packages", "%q is not a Debian package name", p)
		}
	}
	if len(s.Files) > 1024 {
		return bad("files", "at most 1024")
	}
	for i, f := range s.Files {
		if f.Path == "" || f.Path[0] != '/' || path.Clean(f.Path) == "/" || strings.IndexByte(f.Path, 0) >= 0 {
			return bad(fmt.Sprintf("files[%d].path", i), "must be an absolute file path")
		}
		if _, err := base64.StdEncoding.DecodeString(f.Content); err != nil {
			return bad(fmt.Sprintf("files[%d].content", i), "must be base64")
		}
		if f.Mode != "" {
			if m, err := strconv.ParseUint(f.Mode, 8, 32); err != nil || m > 0o7777 {
				return bad(fmt.Sprintf("files[%d].mode", i), "octal permission bits, like 0644")
			}
		}
	}
	for k, v := range s.Env {
		if !envKeyRE.MatchString(k) || strings.IndexByte(v, 0) >= 0 {
			return bad("env", "invalid variable %q", k)
		}
	}
	if s.Workdir != "" && (s.Workdir[0] != '/' || strings.IndexByte(s.Workdir, 0) >= 0) {
		return bad("workdir", "must be an absolute path")
	}
	if len(s.StartCommand) > 0 {
		return bad("start_command", "not supported yet: template snapshots do not exist yet")
	}
	return nil
}

// BuildSpec builds a spec on its base and commits it. A failure leaves
// nothing behind.
func (s *Store) BuildSpec(ctx context.Context, spec Spec, progress io.Writer) (Template, error) {
	if err := spec.Validate(); err != nil {
		return Template{}, err
	}
	base, err := s.Get(spec.Base)
	if err != nil {
		return Template{}, err
	}
	baseRoot, err := s.RootfsPath(base.Digest)
	if err != nil {
		return Template{}, err
	}
	dir, err := s.NewBuild()
	if err != nil {
		return Template{}, err
	}
	rootfs := filepath.Join(dir, "rootfs")
	fail := func(err error) (Template, error) {
		s.Discard(dir)
		return Template{}, err
	}
	fmt.Fprintf(progress, "copying base %s (%s)\n", base.Ref(), base.Digest)
	if err := os.Remove(rootfs); err != nil {
		return fail(err)
	}
	if out, err := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", baseRoot, rootfs).CombinedOutput(); err != nil {
		return fail(fmt.Errorf("copy base: %v: %s", err, strings.TrimSpace(string(out))))
	}
	if len(spec.Packages) > 0 {
		fmt.Fprintf(progress, "installing %s\n", strings.Join(spec.Packages, " "))
		if err := aptInstall(ctx, rootfs, spec.Packages, progress); err != nil {
			return fail(err)
		}
	}
	if err := writeFiles(rootfs, spec.Files); err != nil {
		return fail(err)
	}
	m := meta{Env: spec.Env, Workdir: spec.Workdir, Base: base.Digest}
	return s.commitMeta(ctx, dir, spec.Name, spec.Tag, "spec", m)
}

// aptInstall installs packages into a Debian root file system with the
// rootfs's own apt, in a chroot with /proc and /dev for maintainer scripts.
func aptInstall(ctx context.Context, rootfs string, pkgs []string, progress io.Writer) error {
	if _, err := os.Stat(filepath.Join(rootfs, "usr/bin/apt-get")); err != nil {
		return errdefs.New(errdefs.InvalidArgument, "packages: the base template has no apt-get (it is not Debian)")
	}
	for _, m := range []struct{ src, dst, fstype string }{{"proc", "proc", "proc"}, {"/dev", "dev", ""}} {
		dst := filepath.Join(rootfs, m.dst)
		os.MkdirAll(dst, 0o755)
		flags := uintptr(0)
		if m.fstype == "" {
			flags = syscall.MS_BIND | syscall.MS_REC
		}
		if err := syscall.Mount(m.src, dst, m.fstype, flags, ""); err != nil {
			return fmt.Errorf("mount %s for the package install: %w", m.dst, err)
		}
		defer syscall.Unmount(dst, syscall.MNT_DETACH)
	}
	resolv := filepath.Join(rootfs, "etc/resolv.conf")
	if b, err := os.ReadFile("/etc/resolv.conf"); err == nil {
		os.Remove(resolv)
		os.WriteFile(resolv, b, 0o644)
		defer os.Remove(resolv)
	}
	env := append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "SOURCE_DATE_EPOCH="+SourceDateEpoch)
	run := func(args ...string) error {
		cmd := exec.CommandContext(ctx, "chroot", append([]string{rootfs}, args...)...)
		cmd.Env = env
		var out strings.Builder
		cmd.Stdout = io.MultiWriter(progress, &out)
		cmd.Stderr = io.MultiWriter(progress, &out)
		if err := cmd.Run(); err != nil {
			return errdefs.Wrap(errdefs.InvalidArgument, err, "%s failed: %s", strings.Join(args[:2], " "), lastLines(out.String(), 3))
		}
		return nil
	}
	if err := run("apt-get", "update", "-qq"); err != nil {
		return err
	}
	sorted := append([]string(nil), pkgs...)
	sort.Strings(sorted)
	if err := run(append([]string{"apt-get", "install", "-y", "-qq", "--no-install-recommends"}, sorted...)...); err != nil {
		return err
	}
	for _, g := range []string{"var/lib/apt/lists/*", "var/cache/apt/*.bin", "var/cache/apt/archives/*.deb", "var/log/*", "var/cache/ldconfig/aux-cache", "var/cache/debconf/*-old", "var/lib/dpkg/*-old"} {
		matches, _ := filepath.Glob(filepath.Join(rootfs, g))
		for _, m := range matches {
			os.RemoveAll(m)
		}
	}
	return nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " / ")
}

// writeFiles places files into rootfs; paths resolve inside it (os.Root).
func writeFiles(rootfs string, files []File) error {
	if len(files) == 0 {
		return nil
	}
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer root.Close()
	for _, f := range files {
		rel := strings.TrimPrefix(path.Clean(f.Path), "/")
		data, _ := base64.StdEncoding.DecodeString(f.Content)
		mode := os.FileMode(0o644)
		if f.Mode != "" {
			m, _ := strconv.ParseUint(f.Mode, 8, 32)
			mode = os.FileMode(m)
		}
		if dir := path.Dir(rel); dir != "." {
			if err := root.MkdirAll(dir, 0o755); err != nil {
				return errdefs.Wrap(errdefs.InvalidArgument, err, "file %s: cannot make its directory inside the template", f.Path)
			}
		}
		w, err := root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
		if err != nil {
			return errdefs.Wrap(errdefs.InvalidArgument, err, "file %s: cannot write it inside the template", f.Path)
		}
		_, err = w.Write(data)
		w.Close()
		if err != nil {
			return err
		}
		if err := root.Chmod(rel, mode); err != nil {
			return err
		}
	}
	return nil
}
