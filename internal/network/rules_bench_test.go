//go:build linux

package network

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/spacesandbox/space/internal/netpolicy"
	"github.com/spacesandbox/space/internal/network/nettest"
	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/sandbox"
)

// BenchmarkUpdateRules is the cost of one sandbox's rule change (every
// create, delete and policy change) with N sandboxes known; it must not
// grow with N. BenchmarkWriteRules/N is a whole rewrite (a server start).
//
//	go test -run XXX -bench Rules ./internal/network
func BenchmarkUpdateRules(b *testing.B) { benchRules(b, false) }
func BenchmarkWriteRules(b *testing.B)  { benchRules(b, true) }

func benchRules(b *testing.B, whole bool) {
	nettest.Root(b)
	for _, n := range []int{10, 100, 500} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			m, err := New(context.Background(), Config{Range: netip.MustParsePrefix("10.233.0.0/16"), Uplink: "lo", Gateway: netip.MustParseAddr("127.0.0.1"), DNS: "127.0.0.1:53", StateDir: b.TempDir()})
			if err != nil {
				b.Fatal(err)
			}
			defer m.Destroy()
			pol, _ := netpolicy.Parse(netpolicyPublic())
			m.mu.Lock()
			for i := 1; i <= n; i++ {
				s := &sbxNet{id: fmt.Sprintf("sbx_%d", i), idx: i, kind: runtime.NetTap, policy: pol, learned: newLearned()}
				m.sbx[s.id], m.byIdx[i] = s, s
			}
			m.mu.Unlock()
			if err := m.writeRules(); err != nil {
				b.Fatal(err)
			}
			one := m.byIdx[n/2]
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				var err error
				if whole {
					err = m.writeRules()
				} else {
					one.written = nil // a change: the same policy is not written again
					err = m.updateRules(one)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			m.mu.Lock()
			m.sbx, m.byIdx = map[string]*sbxNet{}, map[int]*sbxNet{}
			m.mu.Unlock()
		})
	}
}

func netpolicyPublic() sandbox.Network {
	return sandbox.Network{Egress: "public", Allow: []string{"203.0.113.0/24"}, Deny: []string{"198.51.100.0/24"}}
}
