package ecw

import (
	"net/http"
	"slices"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
)

// E2B's network options map onto a SPACE policy:
//   - allow_internet_access false → egress none; true → egress public;
//     absent → the server's --default-egress;
//   - network.denyOut → deny, where "0.0.0.0/0" (the SDK's ALL_TRAFFIC)
//     means egress none; network.allowOut → allow (allow wins, as in E2B);
//   - network.allowPublicTraffic → public ingress (E2B's default: true);
//     when false the sandbox's ports need the trafficAccessToken
//     (e2b-traffic-access-token), which is SPACE's ingress token.
//
// Domain rules are SPACE's (DNS, HTTP Host, TLS SNI) and CIDRs are
// nftables'; E2B's per-host rules, egress proxy and request-host masking
// are refused rather than dropped.

// allTraffic is E2B's ALL_TRAFFIC.
const allTraffic = "0.0.0.0/0"

// networkBody is E2B's network object (create, updateNetwork).
type networkBody struct {
	AllowOut           []string `json:"allowOut"`
	DenyOut            []string `json:"denyOut"`
	AllowPublicTraffic *bool    `json:"allowPublicTraffic"`
	MaskRequestHost    *string  `json:"maskRequestHost"`
	HTTPSPorts         []int    `json:"httpsPorts"`
	Rules              any      `json:"rules"`
	EgressProxy        any      `json:"egressProxy"`
}

// networkUpdate is the body of PUT /sandboxes/{id}/network.
type networkUpdate struct {
	AllowOut            []string `json:"allowOut"`
	DenyOut             []string `json:"denyOut"`
	Rules               any      `json:"rules"`
	AllowInternetAccess *bool    `json:"allow_internet_access"`
}

// networkInfo is the network of E2B's SandboxDetail.
type networkInfo struct {
	AllowOut           []string `json:"allowOut"`
	DenyOut            []string `json:"denyOut"`
	AllowPublicTraffic bool     `json:"allowPublicTraffic"`
}

// toPolicy makes a SPACE policy from E2B's options; egress "" is the
// server's default.
func toPolicy(allowInternet *bool, allowOut, denyOut []string) sandbox.Network {
	n := sandbox.Network{Allow: slices.Clone(allowOut), Deny: []string{}}
	if allowInternet != nil {
		n.Egress = "none"
		if *allowInternet {
			n.Egress = "public"
		}
	}
	for _, d := range denyOut {
		if d == allTraffic {
			n.Egress = "none"
			continue
		}
		n.Deny = append(n.Deny, d)
	}
	if n.Allow == nil {
		n.Allow = []string{}
	}
	return n
}

func unsupportedNetwork(rules, egressProxy any, mask *string, https []int) error {
	switch {
	case rules != nil:
		return errdefs.New(errdefs.InvalidArgument, "network.rules is not supported by SPACE (domain names go in allowOut/denyOut)")
	case egressProxy != nil:
		return errdefs.New(errdefs.InvalidArgument, "network.egressProxy is not supported by SPACE")
	case mask != nil:
		return errdefs.New(errdefs.InvalidArgument, "network.maskRequestHost is not supported by SPACE")
	case len(https) > 0:
		return errdefs.New(errdefs.InvalidArgument, "network.httpsPorts is not supported by SPACE")
	}
	return nil
}

// createNetwork is the policy of a create.
func createNetwork(allowInternet *bool, nb *networkBody) (*sandbox.Network, error) {
	if nb == nil {
		n := toPolicy(allowInternet, nil, nil)
		n.PublicIngress = true
		return &n, nil
	}
	if err := unsupportedNetwork(nb.Rules, nb.EgressProxy, nb.MaskRequestHost, nb.HTTPSPorts); err != nil {
		return nil, err
	}
	n := toPolicy(allowInternet, nb.AllowOut, nb.DenyOut)
	n.PublicIngress = nb.AllowPublicTraffic == nil || *nb.AllowPublicTraffic
	return &n, nil
}

func (s *Server) infoNetwork(sb *sandbox.Sandbox) (*networkInfo, *bool) {
	if sb.Network == nil {
		f := false
		return nil, &f
	}
	ni := &networkInfo{AllowOut: slices.Clone(sb.Network.Allow), DenyOut: slices.Clone(sb.Network.Deny), AllowPublicTraffic: sb.Network.PublicIngress}
	if ni.AllowOut == nil {
		ni.AllowOut = []string{}
	}
	if ni.DenyOut == nil {
		ni.DenyOut = []string{}
	}
	internet := sb.Network.Egress == "public"
	if !internet {
		ni.DenyOut = append(ni.DenyOut, allTraffic)
	}
	return ni, &internet
}

// updateNetwork is PUT /sandboxes/{sandboxID}/network (the SDKs'
// updateNetwork): it replaces the egress rules; public traffic stays as
// created.
func (s *Server) updateNetwork(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	var req networkUpdate
	if err := decodeBody(w, r, &req); err != nil {
		return err
	}
	if err := unsupportedNetwork(req.Rules, nil, nil, nil); err != nil {
		return err
	}
	n := toPolicy(req.AllowInternetAccess, req.AllowOut, req.DenyOut)
	if req.AllowInternetAccess == nil && sb.Network != nil && !slices.Contains(req.DenyOut, allTraffic) {
		n.Egress = sb.Network.Egress
	}
	if sb.Network != nil {
		n.PublicIngress = sb.Network.PublicIngress
	}
	if _, err := s.cfg.Engine.UpdateNetwork(r.Context(), sb.ID, n); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
