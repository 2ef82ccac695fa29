package sandbox

import "fmt"

// Transition says what an operation does to a sandbox: the state it passes
// through while in flight and the state it ends in on success.
type Transition struct {
	Through State // transitional state while in flight
	To      State // state on success
	// Immediate means nothing needs doing: the operation succeeds at once
	// (wake of a running sandbox).
	Immediate bool
}

// Plan returns what operation kind k does to a sandbox in state from, or an
// error explaining why the state does not accept it. It does not consider
// operations in flight; the caller checks that separately.
func Plan(k OpKind, from State) (Transition, error) {
	to := k.Target()
	switch k {
	case OpPause:
		if from == Running {
			return Transition{Through: Pausing, To: to}, nil
		}
	case OpSuspend:
		if from == Running || from == Paused {
			return Transition{Through: Suspending, To: to}, nil
		}
	case OpWake:
		switch from {
		case Running:
			return Transition{Through: Running, To: to, Immediate: true}, nil
		case Paused:
			return Transition{Through: Resuming, To: to}, nil
		case Suspended:
			return Transition{Through: Restoring, To: to}, nil
		}
	case OpDelete:
		switch from {
		case Running, Paused, Suspended, Failed:
			return Transition{Through: Deleting, To: to}, nil
		}
	case OpFork, OpSnapshot:
		// The source stays as it is; the operation only holds it still.
		if from == Running || from == Paused {
			return Transition{Through: from, To: from}, nil
		}
		if from == Suspended {
			return Transition{}, fmt.Errorf("cannot %s a suspended sandbox: wake it first", k)
		}
	case OpCreate:
		return Transition{}, fmt.Errorf("create applies to new sandboxes only")
	default:
		return Transition{}, fmt.Errorf("unknown operation kind %q", k)
	}
	return Transition{}, fmt.Errorf("cannot %s a sandbox that is %s", k, from)
}

// Target is the state an operation of kind k leaves its sandbox in when it
// succeeds; "" for kinds that change no sandbox (build).
func (k OpKind) Target() State {
	switch k {
	case OpCreate, OpWake:
		return Running
	case OpPause:
		return Paused
	case OpSuspend:
		return Suspended
	case OpDelete:
		return Deleted
	}
	return ""
}

// Transitional reports whether s is a state an operation passes through.
func (s State) Transitional() bool {
	switch s {
	case Starting, Pausing, Resuming, Suspending, Restoring, Deleting:
		return true
	}
	return false
}

// AcceptsWork reports whether commands and file calls may run in state s.
func (s State) AcceptsWork() bool { return s == Running }
