// Package helm holds SPACE's Helm chart (space/) and its tests: the chart is
// rendered with Helm's own Go library for several value sets, linted as
// `helm lint --strict` would, and every object it makes is decoded strictly
// into its Kubernetes API type (an unknown or misspelt field fails).
package helm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

const chartDir = "space"

// objects is a rendered release, decoded.
type objects struct {
	deployments  []appsv1.Deployment
	daemonSets   []appsv1.DaemonSet
	statefulSets []appsv1.StatefulSet
	services     []corev1.Service
	secrets      []corev1.Secret
	accounts     []corev1.ServiceAccount
	pdbs         []policyv1.PodDisruptionBudget
	names        []string // kind/name of every object
}

// render renders the chart with the values of file ("" for the defaults)
// merged with set, and decodes every object strictly.
func render(t *testing.T, file string, set map[string]any) (*objects, error) {
	t.Helper()
	chrt, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	vals := map[string]any{}
	if file != "" {
		if vals, err = chartutil.ReadValuesFile(file); err != nil {
			t.Fatalf("read %s: %v", file, err)
		}
	}
	vals = chartutil.CoalesceTables(set, vals)
	rv, err := chartutil.ToRenderValues(chrt, vals, chartutil.ReleaseOptions{Name: "prod", Namespace: "sandboxes", IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	out, err := engine.Render(chrt, rv)
	if err != nil {
		return nil, err
	}
	files := make([]string, 0, len(out))
	for name := range out {
		files = append(files, name)
	}
	sort.Strings(files)
	o := &objects{}
	for _, name := range files {
		if !strings.HasSuffix(name, ".yaml") {
			continue
		}
		for i, doc := range strings.Split(out[name], "\n---") {
			if strings.TrimSpace(strings.ReplaceAll(doc, "---", "")) == "" {
				continue
			}
			if err := o.add(doc); err != nil {
				t.Fatalf("%s, document %d: %v\n%s", name, i, err, doc)
			}
		}
	}
	return o, nil
}

// add decodes one YAML document into the type its kind names; unknown
// fields, unknown kinds and wrong API versions fail.
func (o *objects) add(doc string) error {
	j, err := yaml.YAMLToJSON([]byte(doc))
	if err != nil {
		return err
	}
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(j, &head); err != nil {
		return err
	}
	strict := func(v any) error {
		d := json.NewDecoder(bytes.NewReader(j))
		d.DisallowUnknownFields()
		return d.Decode(v)
	}
	want := map[string]string{"Deployment": "apps/v1", "DaemonSet": "apps/v1", "StatefulSet": "apps/v1", "Service": "v1", "Secret": "v1", "ServiceAccount": "v1", "PodDisruptionBudget": "policy/v1"}
	if v, ok := want[head.Kind]; !ok || v != head.APIVersion {
		return fmt.Errorf("%s %s: unexpected kind or apiVersion", head.APIVersion, head.Kind)
	}
	switch head.Kind {
	case "Deployment":
		var v appsv1.Deployment
		err = strict(&v)
		o.deployments = append(o.deployments, v)
	case "DaemonSet":
		var v appsv1.DaemonSet
		err = strict(&v)
		o.daemonSets = append(o.daemonSets, v)
	case "StatefulSet":
		var v appsv1.StatefulSet
		err = strict(&v)
		o.statefulSets = append(o.statefulSets, v)
	case "Service":
		var v corev1.Service
		err = strict(&v)
		o.services = append(o.services, v)
	case "Secret":
		var v corev1.Secret
		err = strict(&v)
		o.secrets = append(o.secrets, v)
	case "ServiceAccount":
		var v corev1.ServiceAccount
		err = strict(&v)
		o.accounts = append(o.accounts, v)
	case "PodDisruptionBudget":
		var v policyv1.PodDisruptionBudget
		err = strict(&v)
		o.pdbs = append(o.pdbs, v)
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", head.Kind, head.Metadata.Name, err)
	}
	o.names = append(o.names, head.Kind+"/"+head.Metadata.Name)
	return nil
}

// pods lists every pod template with the name of its workload.
func (o *objects) pods() map[string]corev1.PodTemplateSpec {
	out := map[string]corev1.PodTemplateSpec{}
	for _, d := range o.deployments {
		out["Deployment/"+d.Name] = d.Spec.Template
	}
	for _, d := range o.daemonSets {
		out["DaemonSet/"+d.Name] = d.Spec.Template
	}
	for _, s := range o.statefulSets {
		out["StatefulSet/"+s.Name] = s.Spec.Template
	}
	return out
}

func subset(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// checkRelease holds for every value set: what `helm lint` cannot see.
func checkRelease(t *testing.T, o *objects, existing []string) {
	t.Helper()
	secrets := slices.Clone(existing)
	for _, s := range o.secrets {
		secrets = append(secrets, s.Name)
		for k, v := range s.StringData {
			if v == "" {
				t.Errorf("secret %s key %s is empty", s.Name, k)
			}
		}
	}
	for name, pod := range o.pods() {
		if pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken {
			t.Errorf("%s mounts a Kubernetes API token SPACE never uses", name)
		}
		for _, c := range append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...) {
			if c.Image == "" || strings.HasSuffix(c.Image, ":") {
				t.Errorf("%s/%s has no image tag: %q", name, c.Name, c.Image)
			}
			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
				t.Errorf("%s/%s requests no CPU or memory", name, c.Name)
			}
			ports := map[string]bool{}
			for _, p := range c.Ports {
				ports[p.Name] = true
			}
			for _, pr := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
				if pr != nil && pr.HTTPGet != nil && !ports[pr.HTTPGet.Port.StrVal] {
					t.Errorf("%s/%s probes port %q it does not declare", name, c.Name, pr.HTTPGet.Port.StrVal)
				}
			}
			for _, e := range c.Env {
				if ref := e.ValueFrom; ref != nil && ref.SecretKeyRef != nil && !slices.Contains(secrets, ref.SecretKeyRef.Name) {
					t.Errorf("%s/%s reads secret %s that neither the chart nor the values provide", name, c.Name, ref.SecretKeyRef.Name)
				}
			}
		}
		mounted := map[string]bool{}
		for _, v := range pod.Spec.Volumes {
			mounted[v.Name] = true
		}
		for _, ss := range o.statefulSets {
			if "StatefulSet/"+ss.Name == name {
				for _, c := range ss.Spec.VolumeClaimTemplates {
					mounted[c.Name] = true
				}
			}
		}
		for _, c := range pod.Spec.Containers {
			for _, m := range c.VolumeMounts {
				if !mounted[m.Name] {
					t.Errorf("%s/%s mounts volume %s that the pod lacks", name, c.Name, m.Name)
				}
			}
		}
	}
	// Every Service and PodDisruptionBudget selects pods of the release.
	pods := o.pods()
	for _, s := range o.services {
		found := false
		for _, p := range pods {
			found = found || subset(s.Spec.Selector, p.Labels)
		}
		if !found {
			t.Errorf("service %s selects no pod of the release", s.Name)
		}
	}
	for _, p := range o.pdbs {
		if !subset(p.Spec.Selector.MatchLabels, pods["Deployment/"+p.Name].Labels) {
			t.Errorf("PodDisruptionBudget %s does not select the control pods", p.Name)
		}
	}
	// The control plane: replicas behind a Service, ready on /readyz.
	if len(o.deployments) != 1 {
		t.Fatalf("%d Deployments, want the control Deployment only", len(o.deployments))
	}
	ctl := o.deployments[0]
	c := ctl.Spec.Template.Spec.Containers[0]
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("control readiness probe = %+v, want GET /readyz", c.ReadinessProbe)
	}
	if !slices.Contains(c.Args, "--role=control") {
		t.Errorf("control args %v", c.Args)
	}
	for _, ds := range o.daemonSets {
		c := ds.Spec.Template.Spec.Containers[0]
		if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
			t.Errorf("node DaemonSet %s is not privileged (gVisor and QEMU need it)", ds.Name)
		}
		if !slices.Contains(c.Args, "--role=node") || !slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--node-url=") }) {
			t.Errorf("node args %v", c.Args)
		}
		data := false
		for _, v := range ds.Spec.Template.Spec.Volumes {
			data = data || (v.Name == "data" && v.HostPath != nil)
		}
		if !data {
			t.Errorf("node DaemonSet %s keeps no host data path (a restarted pod would be a new node)", ds.Name)
		}
	}
}

func TestChartLints(t *testing.T) {
	for _, file := range []string{"", "space/examples/external.yaml"} {
		vals := map[string]any{}
		if file != "" {
			var err error
			if vals, err = chartutil.ReadValuesFile(file); err != nil {
				t.Fatal(err)
			}
		}
		l := lint.All(chartDir, vals, "sandboxes", true)
		for _, m := range l.Messages {
			if m.Severity >= support.WarningSev {
				t.Errorf("helm lint %s: %s", file, m)
			}
		}
	}
}

func TestChartDefaults(t *testing.T) {
	o, err := render(t, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	checkRelease(t, o, nil)
	if *o.deployments[0].Spec.Replicas != 2 {
		t.Errorf("control replicas = %d, want 2", *o.deployments[0].Spec.Replicas)
	}
	if len(o.daemonSets) != 1 || len(o.statefulSets) != 2 || len(o.pdbs) != 1 || len(o.accounts) != 1 {
		t.Errorf("objects: %v", o.names)
	}
	// Kept by the chart: cluster key, admin token, bundled database and
	// bucket credentials.
	if len(o.secrets) != 4 {
		t.Errorf("secrets: %v", o.names)
	}
	for _, s := range o.secrets {
		if v, ok := s.StringData["admin-token"]; ok && (!strings.HasPrefix(v, "space_") || len(v) < 32) {
			t.Errorf("admin token %q", v)
		}
	}
	if args := o.deployments[0].Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--proxy-data-plane") || !slices.Contains(args, "--data-plane-url=http://prod-space.sandboxes.svc:8090") {
		t.Errorf("control args do not proxy the data plane through the Service: %v", args)
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range o.deployments[0].Spec.Template.Spec.Containers[0].Env {
		env[e.Name] = e
	}
	if !strings.HasPrefix(env["SPACE_STORE"].Value, "postgres://space:$(SPACE_PG_PASSWORD)@prod-space-postgresql:5432/") || env["SPACE_ALLOW_PLAIN_HTTP"].Value != "true" {
		t.Errorf("control env: store %+v, plain http %+v", env["SPACE_STORE"], env["SPACE_ALLOW_PLAIN_HTTP"])
	}
}

func TestChartExternal(t *testing.T) {
	o, err := render(t, "space/examples/external.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	checkRelease(t, o, []string{"space-cluster-key", "space-admin", "space-postgres", "space-s3"})
	if len(o.daemonSets) != 3 || len(o.statefulSets) != 0 || len(o.secrets) != 0 {
		t.Errorf("objects: %v", o.names)
	}
	if *o.deployments[0].Spec.Replicas != 3 {
		t.Errorf("control replicas = %d", *o.deployments[0].Spec.Replicas)
	}
	pools := map[string]appsv1.DaemonSet{}
	for _, ds := range o.daemonSets {
		pools[ds.Name] = ds
	}
	metal, ok := pools["prod-space-node-metal"]
	if !ok {
		t.Fatalf("no metal pool: %v", o.names)
	}
	args := strings.Join(metal.Spec.Template.Spec.Containers[0].Args, " ")
	for _, want := range []string{"--runtime=vm", "--node-labels=pool=metal,kvm=true,tier=metal", "--max-sandboxes=150", "--node-url=https://$(POD_IP):8080"} {
		if !strings.Contains(args, want) {
			t.Errorf("metal pool args lack %s: %s", want, args)
		}
	}
	kvm := false
	for _, m := range metal.Spec.Template.Spec.Containers[0].VolumeMounts {
		kvm = kvm || m.MountPath == "/dev/kvm"
	}
	if !kvm || metal.Spec.Template.Spec.NodeSelector["space.dev/pool"] != "metal" {
		t.Errorf("metal pool: kvm %v, node selector %v", kvm, metal.Spec.Template.Spec.NodeSelector)
	}
	if gpu := pools["prod-space-node-gpu"]; len(gpu.Spec.Template.Spec.Tolerations) != 1 {
		t.Errorf("gpu pool tolerations %v", gpu.Spec.Template.Spec.Tolerations)
	}
	for _, e := range o.deployments[0].Spec.Template.Spec.Containers[0].Env {
		if e.Name == "SPACE_ALLOW_PLAIN_HTTP" {
			t.Error("plain HTTP with a TLS secret given")
		}
		if e.Name == "SPACE_STORE" && (e.ValueFrom == nil || e.ValueFrom.SecretKeyRef.Name != "space-postgres") {
			t.Errorf("store URL not from its secret: %+v", e)
		}
	}
}

// Values that cannot work are refused at render time with a reason.
func TestChartRefusesBadValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  map[string]any
		want string
	}{
		{"pool name", map[string]any{"nodePools": []any{map[string]any{"name": "Bad_Name"}}}, "nodePools[0].name"},
		{"database URL in values", map[string]any{"postgresql": map[string]any{"bundled": false, "externalUrl": "postgres://u:p@h/db"}}, "is a secret"},
		{"no database", map[string]any{"postgresql": map[string]any{"bundled": false}}, "postgresql.existingSecret"},
		{"no bucket", map[string]any{"objectStore": map[string]any{"bundled": false}}, "objectStore"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, "", tc.set)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("render = %v, want an error about %s", err, tc.want)
			}
		})
	}
}
