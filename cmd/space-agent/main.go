// Command space-agent runs inside a sandbox and serves the host over one
// byte stream. See package internal/agent.
//
//	space-agent --connect unix:/run/space/agent.sock   dial the host's listener (redials when it drops)
//	space-agent --connect file:/dev/virtio-ports/space.agent
//	space-agent --connect stdio                         serve on stdin/stdout
//	space-agent --sudo …                                also serve sudo (gVisor; see internal/agent/sudo.go)
//	sudo [options] command                              run as "sudo": the helper's client
//
// As /init of a microVM's initramfs (no arguments, PID 1, /modules present)
// it first switches to the sandbox's disk and then serves on the
// virtio-serial port "space.agent".
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"

	"github.com/spacesandbox/space/internal/agent"
)

func main() {
	if filepath.Base(os.Args[0]) == "sudo" {
		os.Exit(agent.SudoMain(os.Args[1:], agent.SudoSocket, os.Stderr))
	}
	connect := flag.String("connect", "stdio", "how to reach the host: unix:PATH, file:PATH or stdio")
	root := flag.String("root", "/", "confine file operations to this directory (tests)")
	hostname := flag.String("hostname", "", "hostname to set when running as PID 1")
	sudo := flag.Bool("sudo", false, "serve sudo on "+agent.SudoSocket+" (runtimes that do not honour setuid)")
	flag.Parse()
	// The agent lives in the sandbox's memory, beside what the user runs:
	// collect at half again its live heap rather than twice it (streaming
	// output turns over a buffer per read).
	debug.SetGCPercent(50)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if _, err := os.Stat("/modules"); err == nil && os.Getpid() == 1 && len(os.Args) == 1 {
		dev, err := agent.VMBoot("space.agent")
		if err != nil {
			// Nothing can serve the host; say why on the console and stop
			// (PID 1 exiting halts the VM).
			fmt.Fprintln(os.Stderr, "space-agent: vm boot:", err)
			os.Exit(1)
		}
		*connect = "file:" + dev
	}
	if os.Getpid() == 1 {
		for _, err := range agent.InitSystem(*hostname) {
			log.Warn("init", "err", err)
		}
	}
	a, err := agent.New(agent.Config{Root: *root, Logger: log})
	if err != nil {
		fmt.Fprintln(os.Stderr, "space-agent:", err)
		os.Exit(1)
	}
	ctx := context.Background()
	if *sudo {
		go func() {
			if err := a.ServeSudo(ctx, agent.SudoSocket); err != nil {
				log.Warn("sudo helper stopped", "err", err)
			}
		}()
	}
	kind, target, _ := strings.Cut(*connect, ":")
	switch kind {
	case "stdio":
		err := a.Serve(ctx, stdio{})
		log.Info("host connection ended", "err", err)
	case "file":
		err := a.ServePort(ctx, target)
		log.Info("serial port closed", "err", err)
	case "unix":
		err := a.ServeUnix(ctx, target)
		log.Info("host connection loop ended", "err", err)
	default:
		fmt.Fprintf(os.Stderr, "space-agent: --connect %q: want unix:PATH, file:PATH or stdio\n", *connect)
		os.Exit(2)
	}
	// As PID 1 the agent must never exit: the sandbox would die with it.
	if os.Getpid() == 1 {
		select {}
	}
}

type stdio struct{}

func (stdio) Read(p []byte) (int, error)  { return os.Stdin.Read(p) }
func (stdio) Write(p []byte) (int, error) { return os.Stdout.Write(p) }
func (stdio) Close() error                { return os.Stdin.Close() }
