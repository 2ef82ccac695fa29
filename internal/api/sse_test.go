package api

import "testing"

func TestParseLastEventID(t *testing.T) {
	for in, want := range map[string]lastEventID{
		"":             {},
		"0":            {after: 0},
		"17":           {after: 17},
		"8589934590":   {after: 8589934590},
		"8589934591":   {resync: true}, // MaxEventID no longer names a position
		"8589934592":   {resync: true},
		"-1":           {resync: true},
		"007":          {resync: true},
		" 7":           {resync: true},
		"seven":        {resync: true},
		"184467440737": {resync: true},
	} {
		if got := parseLastEventID(in); got != want {
			t.Errorf("parseLastEventID(%q) = %+v, want %+v", in, got, want)
		}
	}
	if eventID(MaxEventID+5) != "8589934591" || eventID(3) != "3" {
		t.Fatal("eventID")
	}
}
