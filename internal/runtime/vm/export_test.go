//go:build linux

package vm

import (
	"context"
	"errors"
	"os"

	"github.com/spacesandbox/space/internal/runtime"
)

// LoadStoppedFaultInjection does what a restore does up to the instant
// before its guest runs — QEMU loads the saved device state, the state file
// is marked spent (removed) — and stops there, as a server killed at that
// instant would: QEMU is left paused with the state in it.
func (r *Runtime) LoadStoppedFaultInjection(ctx context.Context, spec runtime.Spec) error {
	cut := errors.New("cut before the guest runs")
	err := r.loadThen(ctx, spec, statePath(spec), func() error {
		if err := os.Remove(statePath(spec)); err != nil {
			return err
		}
		return cut
	})
	if errors.Is(err, cut) {
		return nil
	}
	return err
}

// WaitAgent is waitAgent, for the test of a VM killed before the wait.
func (r *Runtime) WaitAgent(ctx context.Context, id string) error { return r.waitAgent(ctx, id) }

// QEMUPID is the sandbox's QEMU process (0: none).
func (r *Runtime) QEMUPID(id string) int { return r.qemuPID(id) }

// StopFaultInjection stops the VM's vCPUs through QMP as a save does
// before it writes the device state, leaving the save's marks alone (a
// Pause settles them).
func (r *Runtime) StopFaultInjection(ctx context.Context, id string) error {
	q, err := r.qmp(ctx, id)
	if err != nil {
		return err
	}
	defer q.close()
	_, err = q.execute(ctx, "stop", nil)
	return err
}

// SaveUnflushedFaultInjection does what a suspend does up to the end of
// QEMU, before the flush of RAM file and disk, as a server killed at that
// instant would.
func (r *Runtime) SaveUnflushedFaultInjection(ctx context.Context, spec runtime.Spec) error {
	r.exits.Stop(spec.SandboxID)
	return r.saveUnflushed(ctx, spec)
}
