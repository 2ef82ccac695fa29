//go:build ignore

// runsc-seccomp fills in the precompiled seccomp filters of a copy of gVisor's
// source, as gVisor's own (Bazel) build does and `go install` cannot.
//
// A runsc built by the go command carries an empty table of precompiled
// filters, so every sandbox and gofer start compiles its filter from the
// rules: about 40 ms in a boot and 210 ms in a restore (where it competes with
// the page loader) on a 2-core machine, measured with `runsc --debug`. This
// program computes the programs with gVisor's own precompile step and writes
// them into the two filter packages' registration files; runsc then renders
// the matching program at start instead of compiling one.
//
// Run by scripts/install-deps, from a module that requires gvisor.dev/gvisor
// and replaces it with a writable copy, with that copy's path as argument:
//
//	go run runsc-seccomp.go /tmp/x/gvisor
//
// The sentry's variants are kept to those without device proxies (GPU, TPU,
// RDMA: SPACE starts none), every platform, network and file system mode; the
// gofer's are all kept. A variant not precompiled is still compiled at start,
// as before, so nothing breaks if SPACE's flags change.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"gvisor.dev/gvisor/pkg/seccomp/precompiledseccomp"
	bootcfg "gvisor.dev/gvisor/runsc/boot/filter/config"
	gofercfg "gvisor.dev/gvisor/runsc/fsgofer/filter/config"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: go run runsc-seccomp.go GVISOR_SOURCE_COPY")
		os.Exit(2)
	}
	src := os.Args[1]
	if err := run(src); err != nil {
		fmt.Fprintln(os.Stderr, "runsc-seccomp:", err)
		os.Exit(1)
	}
}

func run(src string) error {
	boot, err := bootcfg.PrecompiledPrograms()
	if err != nil {
		return fmt.Errorf("precompile the sentry's filters: %w", err)
	}
	boot = keep(boot, func(name string) bool {
		return strings.Contains(name, " NVProxy=false ") &&
			strings.Contains(name, " TPUProxy=false ") &&
			strings.Contains(name, " RDMAProxy=false ")
	})
	gofer, err := gofercfg.PrecompiledPrograms()
	if err != nil {
		return fmt.Errorf("precompile the gofer's filters: %w", err)
	}
	if err := register(filepath.Join(src, "runsc/boot/filter/filter_precompiled.go"), boot); err != nil {
		return err
	}
	if err := register(filepath.Join(src, "runsc/fsgofer/filter/filter_precompiled.go"), gofer); err != nil {
		return err
	}
	fmt.Printf("runsc-seccomp: %d sentry and %d gofer filters precompiled\n", len(boot), len(gofer))
	return nil
}

func keep(programs []precompiledseccomp.Program, ok func(string) bool) []precompiledseccomp.Program {
	var out []precompiledseccomp.Program
	for _, p := range programs {
		if ok(p.Name) {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// register rewrites gVisor's empty registration file: the build-time switch
// turns off and registerPrograms fills the table. It refuses a file that does
// not look as expected rather than guess (a new gVisor version must be looked at).
func register(path string, programs []precompiledseccomp.Program) error {
	if len(programs) == 0 {
		return fmt.Errorf("%s: no programs to register", path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read the registration file: %w", err)
	}
	const (
		disabled = "const PrecompilationDisabledAtBuildTime = true\n"
		table    = "\tprograms := make(map[string]precompiledseccomp.Program)\n"
	)
	text := string(b)
	if strings.Count(text, disabled) != 1 || strings.Count(text, table) != 1 {
		return fmt.Errorf("%s: not the empty registration file this program knows", path)
	}
	var regs strings.Builder
	regs.WriteString(table)
	for _, p := range programs {
		regs.WriteString(p.Registration("\t", "precompiledseccomp", "programs"))
	}
	text = strings.Replace(text, disabled, "const PrecompilationDisabledAtBuildTime = false\n", 1)
	text = strings.Replace(text, table, regs.String(), 1)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		return fmt.Errorf("write the registration file: %w", err)
	}
	return nil
}
