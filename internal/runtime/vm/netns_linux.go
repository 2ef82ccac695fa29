package vm

import (
	"errors"
	"fmt"
	"os/exec"
	goruntime "runtime"

	"github.com/vishvananda/netns"
)

// startInNetns starts cmd inside the network namespace at path: the fork
// happens on this goroutine's thread, moved into the namespace for the
// moment of the start and back. A thread that cannot be moved back stays
// locked and dies with the goroutine, never serving another.
func startInNetns(cmd *exec.Cmd, path string) error {
	target, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("the sandbox's network namespace: %w", err)
	}
	defer target.Close()
	goruntime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		goruntime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	if err := netns.Set(target); err != nil {
		goruntime.UnlockOSThread()
		return fmt.Errorf("enter the sandbox's network namespace: %w", err)
	}
	startErr := cmd.Start()
	if err := netns.Set(orig); err != nil {
		return errors.Join(startErr, fmt.Errorf("leave the sandbox's network namespace: %w", err))
	}
	goruntime.UnlockOSThread()
	return startErr
}
