package agent

import (
	"strconv"
	"strings"
)

// A sudo policy is the subset of sudoers(5) the agent's sudo helper honours
// (see sudo.go). It grants only what the file grants without a password —
// the helper cannot ask for one — and reads anything it does not understand
// (aliases, negations, digests, command arguments, per-host rules) as
// granting nothing, so an unknown construct can only refuse, never allow.
type sudoPolicy struct {
	rules      []sudoRule
	securePath string // Defaults secure_path, "" when unset
}

// sudoRule is one user specification: who may run what as whom.
type sudoRule struct {
	who      []string // user names, %group, #uid, ALL
	runas    []string // target users; nil means root only
	nopasswd bool
	cmds     []string // ALL or absolute paths (any arguments)
}

// sudoVerdict is the policy's answer for one request.
type sudoVerdict int

const (
	sudoDenied     sudoVerdict = iota // no rule names the user
	sudoNeedsPass                     // a rule matches but wants a password
	sudoNotAllowed                    // rules name the user, none for this command
	sudoAllowed
)

// parseSudoers adds the rules and defaults of one sudoers file to p and
// returns the paths it includes (@include, @includedir and their # forms).
func (p *sudoPolicy) parse(text string) (includes, includeDirs []string) {
	for _, line := range sudoersLines(text) {
		switch {
		case strings.HasPrefix(line, "@includedir ") || strings.HasPrefix(line, "#includedir "):
			includeDirs = append(includeDirs, strings.TrimSpace(line[len("@includedir "):]))
			continue
		case strings.HasPrefix(line, "@include ") || strings.HasPrefix(line, "#include "):
			includes = append(includes, strings.TrimSpace(line[len("@include "):]))
			continue
		case line[0] == '#' && (len(line) < 2 || line[1] < '0' || line[1] > '9'):
			continue
		}
		if rest, ok := strings.CutPrefix(line, "Defaults"); ok {
			p.parseDefaults(rest)
			continue
		}
		if r, ok := parseSudoRule(line); ok {
			p.rules = append(p.rules, r)
		}
	}
	return includes, includeDirs
}

// sudoersLines joins continued lines, drops comments and blank lines.
func sudoersLines(text string) []string {
	var out []string
	var cur strings.Builder
	for _, raw := range strings.Split(text, "\n") {
		raw = strings.TrimRight(raw, " \t\r")
		if c, ok := strings.CutSuffix(raw, "\\"); ok {
			cur.WriteString(c)
			cur.WriteByte(' ')
			continue
		}
		cur.WriteString(raw)
		line := strings.TrimSpace(cur.String())
		cur.Reset()
		if line == "" {
			continue
		}
		// "#1000" at the start is a uid, not a comment.
		if line[0] == '#' && !strings.HasPrefix(line, "#include") && (len(line) < 2 || line[1] < '0' || line[1] > '9') {
			continue
		}
		out = append(out, line)
	}
	return out
}

// parseDefaults takes the one default the helper uses: secure_path. Scoped
// defaults (Defaults:user, Defaults>runas, …) are ignored.
func (p *sudoPolicy) parseDefaults(rest string) {
	if rest == "" || (rest[0] != ' ' && rest[0] != '\t') {
		return
	}
	rest = strings.TrimSpace(rest)
	if v, ok := strings.CutPrefix(rest, "secure_path"); ok {
		v = strings.TrimSpace(v)
		if v, ok = strings.CutPrefix(v, "="); ok {
			p.securePath = strings.Trim(strings.TrimSpace(v), `"`)
		}
	}
}

// parseSudoRule reads "who hosts = (runas) TAG: cmds". Only one host/command
// group per line is read; a rule with ":" separated further groups keeps its
// first.
func parseSudoRule(line string) (sudoRule, bool) {
	lhs, rhs, ok := strings.Cut(line, "=")
	if !ok || strings.ContainsAny(line, "!") {
		return sudoRule{}, false
	}
	fields := strings.Fields(lhs)
	if len(fields) < 2 {
		return sudoRule{}, false
	}
	hosts := splitList(fields[len(fields)-1])
	if !contains(hosts, "ALL") {
		return sudoRule{}, false
	}
	var r sudoRule
	r.who = splitList(strings.Join(fields[:len(fields)-1], ""))
	rhs = strings.TrimSpace(rhs)
	if strings.HasPrefix(rhs, "(") {
		end := strings.IndexByte(rhs, ')')
		if end < 0 {
			return sudoRule{}, false
		}
		users, _, _ := strings.Cut(rhs[1:end], ":")
		r.runas = splitList(users)
		if len(r.runas) == 0 {
			r.runas = []string{"root"} // "(:group)" runs as the invoking user's group only; treat as root-only
		}
		rhs = strings.TrimSpace(rhs[end+1:])
	}
	// Tags: NOPASSWD:, PASSWD:, SETENV:, … — the last of NOPASSWD/PASSWD wins.
	for {
		tag, rest, ok := strings.Cut(rhs, ":")
		tag = strings.TrimSpace(tag)
		if !ok || !sudoTags[tag] {
			break
		}
		switch tag {
		case "NOPASSWD":
			r.nopasswd = true
		case "PASSWD":
			r.nopasswd = false
		}
		rhs = strings.TrimSpace(rest)
	}
	if i := strings.IndexByte(rhs, ':'); i >= 0 {
		rhs = rhs[:i] // a further "host = cmds" group
	}
	for _, c := range strings.Split(rhs, ",") {
		c = strings.TrimSpace(c)
		switch {
		case c == "ALL":
			r.cmds = append(r.cmds, c)
		case strings.HasPrefix(c, "/") && !strings.ContainsAny(c, " \t*?[\\"):
			r.cmds = append(r.cmds, c) // a bare path allows any arguments
		}
	}
	if len(r.who) == 0 || len(r.cmds) == 0 {
		return sudoRule{}, false
	}
	return r, true
}

var sudoTags = map[string]bool{}

func init() {
	for _, t := range strings.Fields("NOPASSWD PASSWD SETENV NOSETENV EXEC NOEXEC LOG_INPUT NOLOG_INPUT LOG_OUTPUT NOLOG_OUTPUT MAIL NOMAIL FOLLOW NOFOLLOW INTERCEPT NOINTERCEPT") {
		sudoTags[t] = true
	}
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// decide answers whether caller (its name, uid and group names) may run
// path as target without a password. Root may always.
func (p *sudoPolicy) decide(caller account, groupNames []string, target, path string) sudoVerdict {
	if caller.uid == 0 {
		return sudoAllowed
	}
	verdict := sudoDenied
	for _, r := range p.rules {
		if !r.names(caller, groupNames) {
			continue
		}
		if verdict == sudoDenied {
			verdict = sudoNotAllowed
		}
		runas := r.runas
		if runas == nil {
			runas = []string{"root"}
		}
		if !contains(runas, "ALL") && !contains(runas, target) {
			continue
		}
		if !contains(r.cmds, "ALL") && !contains(r.cmds, path) {
			continue
		}
		if r.nopasswd {
			return sudoAllowed
		}
		verdict = sudoNeedsPass
	}
	return verdict
}

// allowsAll reports whether a rule lets caller run every command as target
// without a password (what keeping the environment, -E, needs: with a
// rule for some commands only, a kept LD_PRELOAD or PATH would run
// anything).
func (p *sudoPolicy) allowsAll(caller account, groupNames []string, target string) bool {
	if caller.uid == 0 {
		return true
	}
	for _, r := range p.rules {
		runas := r.runas
		if runas == nil {
			runas = []string{"root"}
		}
		if r.nopasswd && r.names(caller, groupNames) && contains(r.cmds, "ALL") && (contains(runas, "ALL") || contains(runas, target)) {
			return true
		}
	}
	return false
}

func (r sudoRule) names(caller account, groupNames []string) bool {
	for _, w := range r.who {
		switch {
		case w == "ALL" || w == caller.name:
			return true
		case strings.HasPrefix(w, "%#"):
			if gid, err := strconv.Atoi(w[2:]); err == nil {
				if gid == caller.gid {
					return true
				}
				for _, g := range caller.groups {
					if int(g) == gid {
						return true
					}
				}
			}
		case strings.HasPrefix(w, "%"):
			if contains(groupNames, w[1:]) {
				return true
			}
		case strings.HasPrefix(w, "#"):
			if uid, err := strconv.Atoi(w[1:]); err == nil && uid == caller.uid {
				return true
			}
		}
	}
	return false
}
