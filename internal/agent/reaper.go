package agent

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// reaper collects every child's exit status in one place. As PID 1 the
// agent also inherits orphans; they are reaped and forgotten. Nothing else
// in the agent may call wait on a child.
type reaper struct {
	mu      sync.Mutex // guards waiters; held across fork and registration
	waiters map[int]chan syscall.WaitStatus
	sigs    chan os.Signal
	stop    chan struct{}
}

func newReaper() *reaper {
	r := &reaper{waiters: map[int]chan syscall.WaitStatus{}, sigs: make(chan os.Signal, 16), stop: make(chan struct{})}
	signal.Notify(r.sigs, syscall.SIGCHLD)
	go r.loop()
	return r
}

func (r *reaper) close() {
	signal.Stop(r.sigs)
	close(r.stop)
}

// start runs start (which forks a child and returns its pid) with the
// reaper locked, so the child's exit cannot be missed, and returns a channel
// that receives its status.
func (r *reaper) start(start func() (int, error)) (<-chan syscall.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := start()
	if err != nil {
		return nil, err
	}
	ch := make(chan syscall.WaitStatus, 1)
	r.waiters[pid] = ch
	return ch, nil
}

func (r *reaper) loop() {
	for {
		select {
		case <-r.stop:
			return
		case <-r.sigs:
		}
		r.reapAll()
	}
}

func (r *reaper) reapAll() {
	for {
		var st syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &st, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		// start() holds mu from fork to registration, so a child of ours is
		// always registered by the time we get the lock; anything else is an
		// orphan inherited as PID 1, now reaped.
		r.mu.Lock()
		if ch, ok := r.waiters[pid]; ok {
			delete(r.waiters, pid)
			ch <- st
		}
		r.mu.Unlock()
	}
}
