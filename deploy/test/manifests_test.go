// Package test renders the Kubernetes overlays under deploy/kubernetes with
// kustomize and decodes every manifest strictly into its API type, so a
// typo in a field name, a wrong type or a missing reference fails the build.
// It is a module of its own, so the Kubernetes libraries stay out of the
// service's go.mod.
package test

import (
	"bytes"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/idemledger/idemledger/ledger/crdb"
)

// newObject returns an empty object of a kind the manifests may hold.
func newObject(apiVersion, kind string) any {
	switch apiVersion + "/" + kind {
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}
	case "v1/Service":
		return &corev1.Service{}
	case "v1/ServiceAccount":
		return &corev1.ServiceAccount{}
	case "v1/Namespace":
		return &corev1.Namespace{}
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}
	case "policy/v1/PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}
	case "networking.k8s.io/v1/NetworkPolicy":
		return &networkingv1.NetworkPolicy{}
	case "batch/v1/Job":
		return &batchv1.Job{}
	case "monitoring.coreos.com/v1/ServiceMonitor":
		return &monitoringv1.ServiceMonitor{}
	case "monitoring.coreos.com/v1/PrometheusRule":
		return &monitoringv1.PrometheusRule{}
	}
	return nil
}

// render runs kustomize on an overlay and decodes every object strictly.
func render(t *testing.T, dir string) map[string]any {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	res, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	objects := map[string]any{}
	for _, r := range res.Resources() {
		b, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		obj := newObject(r.GetApiVersion(), r.GetKind())
		if obj == nil {
			t.Fatalf("%s: no API type for %s %s", dir, r.GetApiVersion(), r.GetKind())
		}
		if err := yaml.UnmarshalStrict(b, obj); err != nil {
			t.Fatalf("%s: %s %s does not decode strictly: %v\n%s", dir, r.GetKind(), r.GetName(), err, b)
		}
		objects[r.GetKind()+"/"+r.GetName()] = obj
	}
	return objects
}

func TestSingleRegion(t *testing.T) {
	objs := render(t, "../kubernetes/overlays/single-region")
	for _, want := range []string{"Deployment/ledgerd", "Service/ledgerd", "PodDisruptionBudget/ledgerd", "NetworkPolicy/ledgerd",
		"ServiceMonitor/ledgerd", "PrometheusRule/ledgerd", "Job/ledgerd-migrate", "ServiceAccount/ledgerd"} {
		if objs[want] == nil {
			t.Errorf("the overlay lacks %s", want)
		}
	}
	d := objs["Deployment/ledgerd"].(*appsv1.Deployment)
	checkDeployment(t, d)
	if *d.Spec.Replicas != 3 || d.Namespace != "idemledger" {
		t.Errorf("replicas %d namespace %q", *d.Spec.Replicas, d.Namespace)
	}
	checkSelectors(t, objs)
}

// regions are the regions of the multi-region overlays.
var regions = []string{"us-east1", "europe-west1", "asia-southeast1"}

// TestMultiRegionStretched: one Kubernetes cluster over three regions, a
// Deployment per region in one namespace, pinned to the region's nodes,
// with the region's database Secret, its --region and the homes file.
func TestMultiRegionStretched(t *testing.T) {
	objs := render(t, "../kubernetes/overlays/multi-region/stretched")
	for _, r := range regions {
		d, ok := objs["Deployment/ledgerd-"+r].(*appsv1.Deployment)
		if !ok {
			t.Fatalf("no Deployment for %s", r)
		}
		checkDeployment(t, d)
		checkHomes(t, objs, d, r)
		terms := d.Spec.Template.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
		if len(terms) != 1 || terms[0].MatchExpressions[0].Values[0] != r {
			t.Errorf("%s: pods not pinned to the region: %+v", r, terms)
		}
		if got := d.Spec.Template.Spec.Containers[0].Env[0].ValueFrom.SecretKeyRef.Name; got != "ledgerd-database-"+r {
			t.Errorf("%s: database secret %q", r, got)
		}
		if d.Spec.Selector.MatchLabels["topology.idemledger.io/region"] != r || d.Namespace != "idemledger" {
			t.Errorf("%s: selector %v does not tell the regions apart, or namespace %q", r, d.Spec.Selector.MatchLabels, d.Namespace)
		}
	}
	checkSelectors(t, objs)
}

// TestMultiRegionPerCluster: a Kubernetes cluster per region, each overlay
// its own namespace with the one-region Secret names, the same image, its
// --region and the same homes file.
func TestMultiRegionPerCluster(t *testing.T) {
	var images []string
	for _, r := range regions {
		objs := render(t, "../kubernetes/overlays/multi-region/per-cluster/"+r)
		ns := "idemledger-" + r
		if _, ok := objs["Namespace/"+ns].(*corev1.Namespace); !ok {
			t.Fatalf("%s: no Namespace %s", r, ns)
		}
		d, ok := objs["Deployment/ledgerd"].(*appsv1.Deployment)
		if !ok {
			t.Fatalf("%s: no Deployment", r)
		}
		checkDeployment(t, d)
		checkHomes(t, objs, d, r)
		if d.Namespace != ns || d.Spec.Template.Spec.Affinity != nil {
			t.Errorf("%s: namespace %q, affinity %+v; want %s and none (the cluster is the region)", r, d.Namespace, d.Spec.Template.Spec.Affinity, ns)
		}
		if got := d.Spec.Template.Spec.Containers[0].Env[0].ValueFrom.SecretKeyRef.Name; got != "ledgerd-database" {
			t.Errorf("%s: database secret %q, want the region's own ledgerd-database", r, got)
		}
		for name, o := range objs {
			if m, ok := o.(interface{ GetNamespace() string }); ok && !strings.HasPrefix(name, "Namespace/") && m.GetNamespace() != ns {
				t.Errorf("%s: %s is in namespace %q", r, name, m.GetNamespace())
			}
		}
		images = append(images, d.Spec.Template.Spec.Containers[0].Image)
		checkSelectors(t, objs)
	}
	if len(slices.Compact(slices.Clone(images))) != 1 {
		t.Errorf("the regions run different images: %v", images)
	}
}

// TestBootstrap: the bootstrap Job runs ledgerd homes apply --migrate
// on the same homes file, as the admin SQL user.
func TestBootstrap(t *testing.T) {
	objs := render(t, "../kubernetes/overlays/multi-region/bootstrap")
	job, ok := objs["Job/ledgerd-apply-homes"].(*batchv1.Job)
	if !ok {
		t.Fatalf("no Job ledgerd-apply-homes: %v", slices.Collect(maps.Keys(objs)))
	}
	c := job.Spec.Template.Spec.Containers[0]
	if len(c.Args) < 2 || c.Args[0] != "homes" || c.Args[1] != "apply" {
		t.Errorf("the Job does not run ledgerd homes apply: %v", c.Args)
	}
	for _, arg := range []string{"--migrate", "--homes=/etc/ledgerd/homes/homes"} {
		if !slices.Contains(c.Args, arg) {
			t.Errorf("the Job lacks %s: %v", arg, c.Args)
		}
	}
	if !strings.HasPrefix(c.Image, "idemledger/ledgerd:") || c.Env[0].ValueFrom.SecretKeyRef.Name != "ledgerd-database-admin" {
		t.Errorf("image %q, secret %q", c.Image, c.Env[0].ValueFrom.SecretKeyRef.Name)
	}
	checkHomesVolume(t, objs, job.Spec.Template.Spec.Volumes)
}

// checkHomes: the Deployment runs in region with the homes file mounted
// from a ConfigMap of the overlay, and follower reads on.
func checkHomes(t *testing.T, objs map[string]any, d *appsv1.Deployment, region string) {
	t.Helper()
	args := d.Spec.Template.Spec.Containers[0].Args
	for _, arg := range []string{"--region=" + region, "--homes=/etc/ledgerd/homes/homes", "--follower-reads=10s"} {
		if !slices.Contains(args, arg) {
			t.Errorf("%s: no %s in %v", d.Name, arg, args)
		}
	}
	h := checkHomesVolume(t, objs, d.Spec.Template.Spec.Volumes)
	if h != nil && !slices.Contains(h.Regions(), region) {
		t.Errorf("%s: the homes file does not declare %s", d.Name, region)
	}
}

// checkHomesVolume finds the homes volume's ConfigMap among objs, checks
// that it holds components/homes/homes, and parses it.
func checkHomesVolume(t *testing.T, objs map[string]any, volumes []corev1.Volume) *crdb.Homes {
	t.Helper()
	i := slices.IndexFunc(volumes, func(v corev1.Volume) bool { return v.Name == "homes" })
	if i < 0 || volumes[i].ConfigMap == nil {
		t.Errorf("no homes volume from a ConfigMap: %+v", volumes)
		return nil
	}
	cm, ok := objs["ConfigMap/"+volumes[i].ConfigMap.Name].(*corev1.ConfigMap)
	if !ok {
		t.Errorf("the homes volume names ConfigMap %s, which the overlay lacks", volumes[i].ConfigMap.Name)
		return nil
	}
	file, err := os.ReadFile("../kubernetes/components/homes/homes")
	if err != nil {
		t.Fatal(err)
	}
	if cm.Data["homes"] != string(file) {
		t.Errorf("ConfigMap %s does not hold components/homes/homes", cm.Name)
	}
	h, err := crdb.ParseHomes(strings.NewReader(cm.Data["homes"]))
	if err != nil {
		t.Errorf("the homes file: %v", err)
		return nil
	}
	if !slices.Equal(h.Regions(), regions) {
		t.Errorf("the homes file's regions %v are not the overlays' %v", h.Regions(), regions)
	}
	return h
}

// checkDeployment holds what every ledgerd Deployment must have.
func checkDeployment(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	pod := d.Spec.Template.Spec
	c := pod.Containers[0]
	if c.ReadinessProbe == nil || c.ReadinessProbe.GRPC == nil || c.StartupProbe == nil || c.StartupProbe.GRPC == nil {
		t.Errorf("%s: want native gRPC readiness and startup probes", d.Name)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("%s: requests and limits missing", d.Name)
	}
	sc := c.SecurityContext
	if pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot ||
		sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		!slices.Contains(sc.Capabilities.Drop, corev1.Capability("ALL")) {
		t.Errorf("%s: security context is not locked down", d.Name)
	}
	listeners := map[string]string{}
	for _, a := range c.Args {
		name, value, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		listeners[name] = value
	}
	health := checkListeners(t, d.Name, listeners)
	for name, probe := range map[string]*corev1.Probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if probe == nil || probe.GRPC == nil || fmt.Sprint(probe.GRPC.Port) != health {
			t.Errorf("%s: the %s probe is not gRPC on --health-listen's port %s", d.Name, name, health)
		}
	}
	for _, arg := range []string{"--tokens=", "--tls-cert=", "--health-listen="} {
		if !slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, arg) }) {
			t.Errorf("%s: no %s argument", d.Name, arg)
		}
	}
	if !strings.HasPrefix(c.Image, "idemledger/ledgerd:") {
		t.Errorf("%s: image %q has no tag", d.Name, c.Image)
	}
}

// checkSelectors: the Service, the PDB and the ServiceMonitor select the
// Deployments' pods.
func checkSelectors(t *testing.T, objs map[string]any) {
	t.Helper()
	checkNetwork(t, objs)
	var podLabels []map[string]string
	for _, o := range objs {
		if d, ok := o.(*appsv1.Deployment); ok {
			podLabels = append(podLabels, d.Spec.Template.Labels)
		}
	}
	matches := func(sel map[string]string) bool {
		for _, labels := range podLabels {
			ok := true
			for k, v := range sel {
				ok = ok && labels[k] == v
			}
			if ok {
				return true
			}
		}
		return false
	}
	for name, o := range objs {
		var sel map[string]string
		switch o := o.(type) {
		case *corev1.Service:
			sel = o.Spec.Selector
		case *policyv1.PodDisruptionBudget:
			sel = o.Spec.Selector.MatchLabels
		case *monitoringv1.ServiceMonitor:
			continue // selects Services
		default:
			continue
		}
		if len(sel) == 0 || !matches(sel) {
			t.Errorf("%s selects %v, which matches no ledgerd pod", name, sel)
		}
	}
}

// ledgerdDefaults are ledgerd's listeners when their flag is not given
// (cmd/ledgerd: docs/ledgerd.md's table).
var ledgerdDefaults = map[string]string{
	"listen": "127.0.0.1:7070", "admin-listen": "127.0.0.1:7071", "http-listen": "127.0.0.1:7072", "health-listen": "",
}

// checkListeners fails unless ledgerd's listeners, as set (flags or
// LEDGER_* variables, by flag name) over its defaults, have distinct
// ports: two on one port, and ledgerd exits at start ("address already
// in use"). It returns --health-listen's port.
func checkListeners(t *testing.T, where string, set map[string]string) string {
	t.Helper()
	byPort := map[string]string{}
	health := ""
	for name, def := range ledgerdDefaults {
		addr := def
		if v, ok := set[name]; ok {
			addr = v
		}
		if addr == "" {
			continue
		}
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Errorf("%s: --%s=%q: %v", where, name, addr, err)
			continue
		}
		if other, ok := byPort[port]; ok {
			t.Errorf("%s: --%s and --%s both listen on port %s: ledgerd would not start", where, name, other, port)
		}
		byPort[port] = name
		if name == "health-listen" {
			health = port
		}
	}
	return health
}

// TestComposeFile decodes the compose file and checks its wiring: every
// service that depends on another names one that exists, and the secrets
// are files in the directory.
func TestComposeFile(t *testing.T) {
	b, err := os.ReadFile("../docker/compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Name     string         `json:"name"`
		Services map[string]any `json:"services"`
		Secrets  map[string]struct {
			File string `json:"file"`
		} `json:"secrets"`
		Volumes map[string]any `json:"volumes"`
	}
	if err := yaml.UnmarshalStrict(b, &compose); err != nil {
		t.Fatal(err)
	}
	for name, s := range compose.Services {
		svc := s.(map[string]any)
		var names []string
		switch d := svc["depends_on"].(type) {
		case []any:
			for _, n := range d {
				names = append(names, n.(string))
			}
		case map[string]any:
			for n := range d {
				names = append(names, n)
			}
		}
		for _, n := range names {
			if compose.Services[n] == nil {
				t.Errorf("%s depends on %s, which is no service", name, n)
			}
		}
	}
	for name, s := range compose.Secrets {
		if _, err := os.Stat("../docker/" + s.File); err != nil {
			t.Errorf("secret %s: %v", name, err)
		}
	}
	if !bytes.Contains(b, []byte("\"migrate\"")) {
		t.Error("the compose file does not migrate")
	}
	ledgerd, _ := compose.Services["ledgerd"].(map[string]any)
	env, _ := ledgerd["environment"].(map[string]any)
	listeners := map[string]string{}
	for k, v := range env {
		if name, ok := strings.CutPrefix(k, "LEDGER_"); ok {
			listeners[strings.ToLower(strings.ReplaceAll(name, "_", "-"))] = fmt.Sprint(v)
		}
	}
	if len(listeners) == 0 {
		t.Fatal("the compose file's ledgerd has no LEDGER_* environment")
	}
	checkListeners(t, "compose", listeners)
}

// pod is a pod a NetworkPolicy is asked about: its namespace's labels and
// its own; node is the kubelet, which no pod selector matches.
type pod struct {
	ns, labels map[string]string
	node       bool
}

var (
	kubelet      = pod{node: true}
	clientPod    = pod{ns: map[string]string{"kubernetes.io/metadata.name": "billing"}, labels: map[string]string{"app": "billing", "idemledger.io/client": "true"}}
	otherPod     = pod{ns: map[string]string{"kubernetes.io/metadata.name": "billing"}, labels: map[string]string{"app": "billing"}}
	prometheus   = pod{ns: map[string]string{"kubernetes.io/metadata.name": "monitoring"}, labels: map[string]string{"app.kubernetes.io/name": "prometheus"}}
	cockroachPod = pod{ns: map[string]string{"kubernetes.io/metadata.name": "cockroach"}, labels: map[string]string{"app.kubernetes.io/name": "cockroachdb"}}
	dnsPod       = pod{ns: map[string]string{"kubernetes.io/metadata.name": "kube-system"}, labels: map[string]string{"k8s-app": "kube-dns"}}
	collector    = pod{ns: map[string]string{"kubernetes.io/metadata.name": "monitoring"}, labels: map[string]string{"app.kubernetes.io/name": "opentelemetry-collector"}}
)

// policiesOf are the NetworkPolicies of objs that select d's pods.
func policiesOf(t *testing.T, objs map[string]any, d *appsv1.Deployment) []*networkingv1.NetworkPolicy {
	t.Helper()
	var nps []*networkingv1.NetworkPolicy
	for _, o := range objs {
		np, ok := o.(*networkingv1.NetworkPolicy)
		if !ok || np.Namespace != d.Namespace {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil {
			t.Fatal(err)
		}
		if sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			nps = append(nps, np)
		}
	}
	return nps
}

// matches reports whether peers (a rule's from or to; none: everyone)
// take p, for a policy in namespace ns.
func matches(t *testing.T, peers []networkingv1.NetworkPolicyPeer, ns string, p pod) bool {
	t.Helper()
	if len(peers) == 0 {
		return true
	}
	sel := func(s *metav1.LabelSelector, l map[string]string) bool {
		x, err := metav1.LabelSelectorAsSelector(s)
		if err != nil {
			t.Fatal(err)
		}
		return x.Matches(labels.Set(l))
	}
	for _, peer := range peers {
		if p.node || peer.IPBlock != nil {
			continue
		}
		nsOK := p.ns["kubernetes.io/metadata.name"] == ns
		if peer.NamespaceSelector != nil {
			nsOK = sel(peer.NamespaceSelector, p.ns)
		}
		if nsOK && (peer.PodSelector == nil || sel(peer.PodSelector, p.labels)) {
			return true
		}
	}
	return false
}

// reaches reports whether the NetworkPolicies let traffic between d's pods
// and p on port: in (p to the pod) or out (the pod to p).
func reaches(t *testing.T, nps []*networkingv1.NetworkPolicy, ns string, p pod, port string, in bool) bool {
	t.Helper()
	for _, np := range nps {
		if in {
			for _, r := range np.Spec.Ingress {
				if matches(t, r.From, ns, p) && slices.ContainsFunc(r.Ports, func(pp networkingv1.NetworkPolicyPort) bool { return pp.Port.String() == port }) {
					return true
				}
			}
			continue
		}
		for _, r := range np.Spec.Egress {
			if matches(t, r.To, ns, p) && slices.ContainsFunc(r.Ports, func(pp networkingv1.NetworkPolicyPort) bool { return pp.Port.String() == port }) {
				return true
			}
		}
	}
	return false
}

// checkNetwork: the NetworkPolicies that select each ledgerd pod let its
// clients reach gRPC and Connect, Prometheus the admin port, the kubelet
// every probe's port, and the pod reach CockroachDB and DNS; and they keep
// out a pod that is not a client.
func checkNetwork(t *testing.T, objs map[string]any) {
	t.Helper()
	for _, o := range objs {
		d, ok := o.(*appsv1.Deployment)
		if !ok {
			continue
		}
		nps := policiesOf(t, objs, d)
		if len(nps) == 0 {
			t.Errorf("%s: no NetworkPolicy selects its pods", d.Name)
			continue
		}
		c := d.Spec.Template.Spec.Containers[0]
		probes := map[string]*corev1.Probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe, "liveness": c.LivenessProbe}
		for name, probe := range probes {
			port := ""
			switch {
			case probe == nil:
				continue
			case probe.GRPC != nil:
				port = fmt.Sprint(probe.GRPC.Port)
			case probe.HTTPGet != nil:
				port = probe.HTTPGet.Port.String()
				for _, cp := range c.Ports {
					if cp.Name == port {
						port = fmt.Sprint(cp.ContainerPort)
					}
				}
			}
			if !reaches(t, nps, d.Namespace, kubelet, port, true) {
				t.Errorf("%s: the %s probe's port %s is closed to the kubelet by the NetworkPolicy", d.Name, name, port)
			}
		}
		for _, c := range []struct {
			what string
			p    pod
			port string
			in   bool
			want bool
		}{
			{"a client to gRPC", clientPod, "7070", true, true},
			{"a client to Connect", clientPod, "7072", true, true},
			{"a pod that is no client to gRPC", otherPod, "7070", true, false},
			{"Prometheus to the admin port", prometheus, "7071", true, true},
			{"a client to the admin port", clientPod, "7071", true, false},
			{"ledgerd to CockroachDB", cockroachPod, "26257", false, true},
			{"ledgerd to DNS", dnsPod, "53", false, true},
		} {
			if got := reaches(t, nps, d.Namespace, c.p, c.port, c.in); got != c.want {
				t.Errorf("%s: %s on %s: allowed %v, want %v", d.Name, c.what, c.port, got, c.want)
			}
		}
	}
}

// TestNetworkKnobs renders single-region with the two components that
// deploy/README.md's "Network" adds (testdata/knobs): ledgerd's pods may
// then reach a database outside the cluster on CockroachDB's and
// PostgreSQL's ports, and an OpenTelemetry collector on OTLP's, and
// ledgerd is told where the collector is; the probes stay open.
func TestNetworkKnobs(t *testing.T) {
	objs := render(t, "testdata/knobs")
	d := objs["Deployment/ledgerd"].(*appsv1.Deployment)
	checkDeployment(t, d)
	checkSelectors(t, objs)
	nps := policiesOf(t, objs, d)
	for _, c := range []struct {
		what string
		p    pod
		port string
	}{
		{"a database outside the cluster (CockroachDB)", pod{node: true}, "26257"},
		{"a database outside the cluster (PostgreSQL)", pod{node: true}, "5432"},
		{"the collector (OTLP/gRPC)", collector, "4317"},
		{"the collector (OTLP/HTTP)", collector, "4318"},
	} {
		if !reaches(t, nps, d.Namespace, c.p, c.port, false) && !reachesAddress(nps, c.port) {
			t.Errorf("ledgerd may not reach %s on %s", c.what, c.port)
		}
	}
	env := map[string]string{}
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	if !strings.HasSuffix(env["OTEL_EXPORTER_OTLP_ENDPOINT"], ":4317") || env["OTEL_EXPORTER_OTLP_PROTOCOL"] != "grpc" {
		t.Errorf("ledgerd is not told where the collector is: %v", env)
	}
}

// reachesAddress reports whether an egress rule to an IP block opens port.
func reachesAddress(nps []*networkingv1.NetworkPolicy, port string) bool {
	for _, np := range nps {
		for _, r := range np.Spec.Egress {
			for _, to := range r.To {
				if to.IPBlock != nil && slices.ContainsFunc(r.Ports, func(pp networkingv1.NetworkPolicyPort) bool { return pp.Port.String() == port }) {
					return true
				}
			}
		}
	}
	return false
}
