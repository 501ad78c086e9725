// Package test renders the Kubernetes overlays under deploy/kubernetes with
// kustomize and decodes every manifest strictly into its API type, so a
// typo in a field name, a wrong type or a missing reference fails the build.
// It is a module of its own, so the Kubernetes libraries stay out of the
// service's go.mod.
package test

import (
	"bytes"
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

func TestMultiRegion(t *testing.T) {
	objs := render(t, "../kubernetes/overlays/multi-region")
	regions := []string{"us-east1", "europe-west1", "asia-southeast1"}
	for _, r := range regions {
		d, ok := objs["Deployment/ledgerd-"+r].(*appsv1.Deployment)
		if !ok {
			t.Fatalf("no Deployment for %s", r)
		}
		checkDeployment(t, d)
		terms := d.Spec.Template.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
		if len(terms) != 1 || terms[0].MatchExpressions[0].Values[0] != r {
			t.Errorf("%s: pods not pinned to the region: %+v", r, terms)
		}
		if got := d.Spec.Template.Spec.Containers[0].Env[0].ValueFrom.SecretKeyRef.Name; got != "ledgerd-database-"+r {
			t.Errorf("%s: database secret %q", r, got)
		}
		if d.Spec.Selector.MatchLabels["topology.idemledger.io/region"] != r {
			t.Errorf("%s: selector %v does not tell the regions apart", r, d.Spec.Selector.MatchLabels)
		}
	}
	checkSelectors(t, objs)
	boot := render(t, "../kubernetes/overlays/multi-region/bootstrap")
	cm := boot["ConfigMap/ledgerd-multiregion-sql"].(*corev1.ConfigMap)
	stmts, err := crdb.MultiRegionSQL("idemledger", regions, "region")
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Join(stmts, ";\n") + ";\n"; cm.Data["multiregion.sql"] != want {
		t.Errorf("multiregion.sql is not what crdb.MultiRegionSQL says; regenerate it:\n%s", want)
	}
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
	if !bytes.Contains(b, []byte("--migrate-only")) {
		t.Error("the compose file does not migrate")
	}
}
