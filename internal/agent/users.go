package agent

import (
	"bufio"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/agent/proto"
)

// account is a user of the sandbox, from its /etc/passwd and /etc/group.
type account struct {
	name     string
	uid, gid int
	home     string
	shell    string
	groups   []uint32 // supplementary groups
}

// names maps ids to user and group names for file listings; rebuilt at most
// every few seconds.
type names struct {
	mu     sync.Mutex
	at     time.Time
	users  map[int]string
	groups map[int]string
}

// readDB reads a colon-separated database (passwd, group) from the sandbox's
// file system; a missing file reads as empty.
func (a *Agent) readDB(name string, fn func(fields []string)) {
	f, err := a.fs.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, 4<<20))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		fn(strings.Split(line, ":"))
	}
}

// lookupUser resolves a user name (or a numeric uid) in the sandbox.
func (a *Agent) lookupUser(name string) (account, error) {
	var acc account
	found := false
	uid, numeric := -1, false
	if n, err := strconv.Atoi(name); err == nil && n >= 0 {
		uid, numeric = n, true
	}
	a.readDB("/etc/passwd", func(f []string) {
		if found || len(f) < 7 {
			return
		}
		u, err1 := strconv.Atoi(f[2])
		g, err2 := strconv.Atoi(f[3])
		if err1 != nil || err2 != nil {
			return
		}
		if f[0] == name || (numeric && u == uid) {
			acc, found = account{name: f[0], uid: u, gid: g, home: f[5], shell: f[6]}, true
		}
	})
	if !found {
		if name == "root" {
			return account{name: "root", home: "/root", shell: "/bin/sh"}, nil
		}
		if numeric {
			return account{name: name, uid: uid, gid: uid, home: "/", shell: "/bin/sh"}, nil
		}
		return account{}, proto.Errorf(proto.CodeInvalidArgument, "user %q does not exist in the sandbox", name)
	}
	a.readDB("/etc/group", func(f []string) {
		if len(f) < 4 {
			return
		}
		g, err := strconv.Atoi(f[2])
		if err != nil || g == acc.gid {
			return
		}
		for _, m := range strings.Split(f[3], ",") {
			if m == acc.name {
				acc.groups = append(acc.groups, uint32(g))
			}
		}
	})
	if acc.home == "" {
		acc.home = "/"
	}
	if acc.shell == "" {
		acc.shell = "/bin/sh"
	}
	return acc, nil
}

// owners returns the user and group names of uid and gid ("" when unknown).
func (a *Agent) owners(uid, gid int) (string, string) {
	n := &a.names
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.users == nil || time.Since(n.at) > 5*time.Second {
		n.users, n.groups, n.at = map[int]string{}, map[int]string{}, time.Now()
		a.readDB("/etc/passwd", func(f []string) {
			if len(f) >= 3 {
				if id, err := strconv.Atoi(f[2]); err == nil {
					if _, dup := n.users[id]; !dup {
						n.users[id] = f[0]
					}
				}
			}
		})
		a.readDB("/etc/group", func(f []string) {
			if len(f) >= 3 {
				if id, err := strconv.Atoi(f[2]); err == nil {
					if _, dup := n.groups[id]; !dup {
						n.groups[id] = f[0]
					}
				}
			}
		})
	}
	return n.users[uid], n.groups[gid]
}
