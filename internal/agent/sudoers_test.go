package agent

import (
	"testing"
)

func TestSudoersPolicy(t *testing.T) {
	var p sudoPolicy
	incs, dirs := p.parse(`# comment
Defaults	env_reset
Defaults	secure_path="/usr/local/sbin:/usr/bin:/bin"
Defaults:ops	!requiretty
root	ALL=(ALL:ALL) ALL
%sudo	ALL=(ALL:ALL) ALL
user ALL=(ALL:ALL) NOPASSWD: ALL
%wheel ALL = (root) NOPASSWD: /usr/bin/id, /usr/bin/apt-get *
#1005 ALL=NOPASSWD:/usr/bin/true
svc ALL=(ALL) NOPASSWD: ALL, !/bin/sh
long ALL=(ALL) \
  NOPASSWD: ALL
web somehost=(ALL) NOPASSWD: ALL
Cmnd_Alias SHUT = /sbin/halt
alias ALL=(ALL) NOPASSWD: SHUT
#includedir /etc/sudoers.d
@include extra
`)
	if len(dirs) != 1 || dirs[0] != "/etc/sudoers.d" || len(incs) != 1 || incs[0] != "extra" {
		t.Fatalf("includes %q, dirs %q", incs, dirs)
	}
	if p.securePath != "/usr/local/sbin:/usr/bin:/bin" {
		t.Fatalf("secure_path %q", p.securePath)
	}
	acc := func(name string, uid int) account { return account{name: name, uid: uid, gid: uid} }
	cases := []struct {
		name   string
		caller account
		groups []string
		target string
		path   string
		want   sudoVerdict
	}{
		{"root always", acc("root", 0), nil, "nobody", "/bin/sh", sudoAllowed},
		{"nopasswd all", acc("user", 1000), nil, "root", "/usr/bin/apt-get", sudoAllowed},
		{"nopasswd all as another user", acc("user", 1000), nil, "postgres", "/bin/sh", sudoAllowed},
		{"group needs a password", acc("dev", 1001), []string{"sudo"}, "root", "/bin/sh", sudoNeedsPass},
		{"group command listed", acc("ops", 1002), []string{"wheel"}, "root", "/usr/bin/id", sudoAllowed},
		{"group command with a wildcard is not read", acc("ops", 1002), []string{"wheel"}, "root", "/usr/bin/apt-get", sudoNotAllowed},
		{"group command not listed", acc("ops", 1002), []string{"wheel"}, "root", "/bin/sh", sudoNotAllowed},
		{"group runas root only", acc("ops", 1002), []string{"wheel"}, "postgres", "/usr/bin/id", sudoNotAllowed},
		{"uid rule, runas omitted is root", acc("x", 1005), nil, "root", "/usr/bin/true", sudoAllowed},
		{"uid rule, not as others", acc("x", 1005), nil, "postgres", "/usr/bin/true", sudoNotAllowed},
		{"negation grants nothing", acc("svc", 1003), nil, "root", "/usr/bin/id", sudoDenied},
		{"continued line", acc("long", 1004), nil, "root", "/usr/bin/id", sudoAllowed},
		{"other host grants nothing", acc("web", 1006), nil, "root", "/usr/bin/id", sudoDenied},
		{"aliases grant nothing", acc("alias", 1007), nil, "root", "/sbin/halt", sudoDenied},
		{"stranger", acc("eve", 1008), nil, "root", "/usr/bin/id", sudoDenied},
	}
	for _, c := range cases {
		if got := p.decide(c.caller, c.groups, c.target, c.path); got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
}

func TestShellJoin(t *testing.T) {
	for in, want := range map[string]string{
		"a":        "a",
		"a b":      "'a b'",
		"it's":     `'it'\''s'`,
		"":         "''",
		"/x/y=1,2": "/x/y=1,2",
		"$HOME":    "'$HOME'",
	} {
		if got := shellJoin([]string{in}); got != want {
			t.Errorf("shellJoin(%q) = %s, want %s", in, got, want)
		}
	}
}

// FuzzSudoers: whatever a sandbox's sudoers holds, parsing and deciding
// never panic, and a caller no line names is never allowed.
func FuzzSudoers(f *testing.F) {
	f.Add("user ALL=(ALL:ALL) NOPASSWD: ALL\n")
	f.Add("%wheel ALL = (root) NOPASSWD: /usr/bin/id\nDefaults secure_path=\"/bin\"\n")
	f.Add("a ALL=(\\\n")
	f.Add("#includedir /etc/sudoers.d\n@include x\n")
	f.Fuzz(func(t *testing.T, text string) {
		var p sudoPolicy
		p.parse(text)
		for _, r := range p.rules {
			if len(r.who) == 0 || len(r.cmds) == 0 {
				t.Fatalf("rule without users or commands: %+v", r)
			}
		}
		stranger := account{name: "\x00stranger", uid: 4242, gid: 4242}
		if v := p.decide(stranger, nil, "root", "/bin/sh"); v == sudoAllowed {
			// Only an ALL or #4242 user list can name the stranger.
			named := false
			for _, r := range p.rules {
				named = named || contains(r.who, "ALL") || contains(r.who, "#4242") || contains(r.who, "%#4242")
			}
			if !named {
				t.Fatalf("stranger allowed by %+v", p.rules)
			}
		}
		p.decide(account{name: "root"}, []string{"root"}, "root", "/bin/sh")
	})
}
