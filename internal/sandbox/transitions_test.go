package sandbox

import "testing"

func TestPlan(t *testing.T) {
	type want struct {
		ok      bool
		through State
		to      State
		instant bool
	}
	cases := []struct {
		kind OpKind
		from State
		want want
	}{
		{OpPause, Running, want{true, Pausing, Paused, false}},
		{OpPause, Paused, want{}},
		{OpPause, Suspended, want{}},
		{OpPause, Starting, want{}},
		{OpSuspend, Running, want{true, Suspending, Suspended, false}},
		{OpSuspend, Paused, want{true, Suspending, Suspended, false}},
		{OpSuspend, Suspended, want{}},
		{OpSuspend, Failed, want{}},
		{OpWake, Running, want{true, Running, Running, true}},
		{OpWake, Paused, want{true, Resuming, Running, false}},
		{OpWake, Suspended, want{true, Restoring, Running, false}},
		{OpWake, Failed, want{}},
		{OpWake, Deleted, want{}},
		{OpDelete, Running, want{true, Deleting, Deleted, false}},
		{OpDelete, Paused, want{true, Deleting, Deleted, false}},
		{OpDelete, Suspended, want{true, Deleting, Deleted, false}},
		{OpDelete, Failed, want{true, Deleting, Deleted, false}},
		{OpDelete, Deleted, want{}},
		{OpDelete, Starting, want{}},
		{OpCreate, Running, want{}},
		{"bogus", Running, want{}},
	}
	for _, c := range cases {
		tr, err := Plan(c.kind, c.from)
		if (err == nil) != c.want.ok {
			t.Errorf("Plan(%s, %s) err = %v, want ok=%v", c.kind, c.from, err, c.want.ok)
			continue
		}
		if err != nil {
			continue
		}
		if tr.Through != c.want.through || tr.To != c.want.to || tr.Immediate != c.want.instant {
			t.Errorf("Plan(%s, %s) = %+v, want %+v", c.kind, c.from, tr, c.want)
		}
	}
}

func TestTransitionalStatesAreNotTargets(t *testing.T) {
	for _, s := range States {
		if !s.Valid() {
			t.Fatalf("%s not valid", s)
		}
		for _, k := range []OpKind{OpPause, OpSuspend, OpWake, OpDelete} {
			if tr, err := Plan(k, s); err == nil && tr.To.Transitional() {
				t.Errorf("Plan(%s,%s) ends in transitional %s", k, s, tr.To)
			}
			if s.Transitional() {
				if _, err := Plan(k, s); err == nil {
					t.Errorf("%s accepted in transitional state %s", k, s)
				}
			}
		}
	}
}

// Every accepted transition ends in its kind's one target state (the engine
// records that state when the operation succeeds).
func TestPlanEndsInTheKindsTarget(t *testing.T) {
	kinds := []OpKind{OpCreate, OpPause, OpSuspend, OpWake, OpDelete}
	states := []State{Starting, Running, Pausing, Paused, Resuming, Suspending, Suspended, Restoring, Deleting, Deleted, Failed}
	for _, k := range kinds {
		if k.Target() == "" || k.Target().Transitional() {
			t.Errorf("%s: target %q is not a state at rest", k, k.Target())
		}
		for _, from := range states {
			tr, err := Plan(k, from)
			if err == nil && tr.To != k.Target() {
				t.Errorf("Plan(%s, %s).To = %s, want %s", k, from, tr.To, k.Target())
			}
		}
	}
	if OpBuild.Target() != "" {
		t.Errorf("build changes no sandbox, target %q", OpBuild.Target())
	}
}
