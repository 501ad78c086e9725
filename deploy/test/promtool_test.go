package test

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// monitoredOverlays are the overlays that a Prometheus scrapes: each
// per-cluster region has a Prometheus of its own, the stretched cluster
// one for its three regions.
var monitoredOverlays = []string{
	"single-region",
	"multi-region/per-cluster/us-east1",
	"multi-region/per-cluster/europe-west1",
	"multi-region/per-cluster/asia-southeast1",
	"multi-region/stretched",
}

// TestAlertRulesPerOverlay renders each overlay that Prometheus scrapes
// and checks its monitoring as the Prometheus operator would run it: each
// ledgerd Service is selected by exactly one ServiceMonitor, so that each
// pod is scraped once, as job "ledgerd" (the rules' and the dashboard's
// job); the overlay has one PrometheusRule, so that each alert exists
// once; its rules read only metrics ledgerd exports. Then promtool (this
// module's tool, from the module proxy) runs unit tests of the rules with
// series labelled as that scrape labels them: healthy pods raise no
// alert, one pod NOT_SERVING raises IdemledgerNotReady for that pod, no
// pod up raises IdemledgerDown, and takeovers in one namespace raise
// IdemledgerTakeovers naming it.
func TestAlertRulesPerOverlay(t *testing.T) {
	if testing.Short() {
		t.Skip("builds promtool and runs ledgerd for its metrics")
	}
	exported := exportedMetrics(t)
	for _, overlay := range monitoredOverlays {
		t.Run(overlay, func(t *testing.T) {
			objs := render(t, "../kubernetes/overlays/"+overlay)
			pods, rule := scrapedPods(t, objs)
			file, _ := rules(t, "../kubernetes/overlays/"+overlay)
			checkMetricNames(t, overlay+"'s rules", exprsOfRules(rule), exported)
			promtoolTest(t, file, rule, pods)
		})
	}
}

// scrapedPods checks the overlay's ServiceMonitors against its Services
// and returns the labels of each pod's scrape target, and its one
// PrometheusRule.
func scrapedPods(t *testing.T, objs map[string]any) ([]map[string]string, *monitoringv1.PrometheusRule) {
	t.Helper()
	var services []*corev1.Service
	var monitors []*monitoringv1.ServiceMonitor
	var deployments []*appsv1.Deployment
	var prules []*monitoringv1.PrometheusRule
	for _, k := range slices.Sorted(maps.Keys(objs)) {
		switch o := objs[k].(type) {
		case *corev1.Service:
			services = append(services, o)
		case *monitoringv1.ServiceMonitor:
			monitors = append(monitors, o)
		case *appsv1.Deployment:
			deployments = append(deployments, o)
		case *monitoringv1.PrometheusRule:
			prules = append(prules, o)
		}
	}
	if len(prules) != 1 {
		t.Fatalf("%d PrometheusRules: every alert would exist %d times", len(prules), len(prules))
	}
	var alerts []string
	for _, g := range prules[0].Spec.Groups {
		for _, r := range g.Rules {
			if slices.Contains(alerts, r.Alert) {
				t.Errorf("alert %s exists twice", r.Alert)
			}
			alerts = append(alerts, r.Alert)
		}
	}
	var pods []map[string]string
	for i, d := range deployments {
		var svc *corev1.Service
		for _, s := range services {
			if s.Namespace == d.Namespace && len(s.Spec.Selector) > 0 && labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
				svc = s
			}
		}
		if svc == nil {
			t.Fatalf("no Service selects Deployment %s's pods", d.Name)
		}
		var scrapers []*monitoringv1.ServiceMonitor
		for _, m := range monitors {
			sel, err := metav1.LabelSelectorAsSelector(&m.Spec.Selector)
			if err != nil {
				t.Fatal(err)
			}
			if m.Namespace == svc.Namespace && !sel.Empty() && sel.Matches(labels.Set(svc.Labels)) {
				scrapers = append(scrapers, m)
			}
		}
		if len(scrapers) != 1 {
			t.Fatalf("Service %s is selected by %d ServiceMonitors, want 1: each of its pods would be scraped %d times", svc.Name, len(scrapers), len(scrapers))
		}
		m := scrapers[0]
		job := svc.Name
		if m.Spec.JobLabel != "" {
			job = svc.Labels[m.Spec.JobLabel]
		}
		if job != "ledgerd" {
			t.Fatalf("Service %s is scraped as job %q; the rules and the dashboard read job \"ledgerd\"", svc.Name, job)
		}
		replicas := int32(1)
		if d.Spec.Replicas != nil {
			replicas = *d.Spec.Replicas
		}
		for n := range replicas {
			pods = append(pods, map[string]string{
				"job": job, "namespace": svc.Namespace, "service": svc.Name, "endpoint": m.Spec.Endpoints[0].Port,
				"pod": fmt.Sprintf("%s-%d", d.Name, n), "container": d.Spec.Template.Spec.Containers[0].Name,
				"instance": fmt.Sprintf("10.0.%d.%d:7071", i, n),
			})
		}
	}
	if len(pods) == 0 {
		t.Fatal("no pod is scraped")
	}
	return pods, prules[0]
}

// promtoolTest writes the rule file and a unit test of it for pods and
// runs promtool test rules.
func promtoolTest(t *testing.T, ruleFile []byte, rule *monitoringv1.PrometheusRule, pods []map[string]string) {
	t.Helper()
	annotations := map[string]map[string]string{}
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			a := map[string]string{}
			for k, v := range r.Annotations {
				a[k] = v
			}
			annotations[r.Alert] = a
		}
	}
	series := func(name string, extra map[string]string, values func(pod int) string) []map[string]string {
		var out []map[string]string
		for i, p := range pods {
			l := map[string]string{}
			for k, v := range p {
				l[k] = v
			}
			for k, v := range extra {
				l[k] = v
			}
			out = append(out, map[string]string{"series": selector(name, l), "values": values(i)})
		}
		return out
	}
	alert := func(name string, labels map[string]string, value string) map[string]any {
		exp := map[string]string{}
		for k, v := range annotations[name] {
			exp[k] = expand(v, labels, value)
		}
		return map[string]any{"exp_labels": labels, "exp_annotations": exp}
	}
	ready := func(pod int) string { return "1x40" }
	up := func(pod int) string { return "1x40" }
	first := pods[0]["pod"]
	tests := []map[string]any{
		{ // every pod up and ready: quiet
			"interval":     "1m",
			"input_series": append(series("up", nil, up), series("idemledger_ready", nil, ready)...),
			"alert_rule_test": []map[string]any{
				{"eval_time": "10m", "alertname": "IdemledgerDown", "exp_alerts": []any{}},
				{"eval_time": "10m", "alertname": "IdemledgerNotReady", "exp_alerts": []any{}},
				{"eval_time": "30m", "alertname": "IdemledgerTakeovers", "exp_alerts": []any{}},
			},
		},
		{ // one pod NOT_SERVING: that pod's alert, once
			"interval": "1m",
			"input_series": append(series("up", nil, up), series("idemledger_ready", nil, func(pod int) string {
				if pod == 0 {
					return "0x40"
				}
				return "1x40"
			})...),
			"alert_rule_test": []map[string]any{
				{"eval_time": "10m", "alertname": "IdemledgerNotReady", "exp_alerts": []any{alert("IdemledgerNotReady", map[string]string{"pod": first, "severity": "page"}, "")}},
				{"eval_time": "10m", "alertname": "IdemledgerDown", "exp_alerts": []any{}},
			},
		},
		{ // no pod up: down
			"interval":     "1m",
			"input_series": series("up", nil, func(int) string { return "0x40" }),
			"alert_rule_test": []map[string]any{
				{"eval_time": "10m", "alertname": "IdemledgerDown", "exp_alerts": []any{alert("IdemledgerDown", map[string]string{"severity": "page"}, "")}},
			},
		},
		{ // takeovers in billing, 2 a second from the first pod; none in search
			"interval": "1m",
			"input_series": append(series("idemledger_decisions_total", map[string]string{"decision": "taken_over", "ledger_namespace": "billing"}, func(pod int) string {
				if pod == 0 {
					return "0+120x40"
				}
				return "0x40"
			}), series("idemledger_decisions_total", map[string]string{"decision": "taken_over", "ledger_namespace": "search"}, func(int) string { return "0x40" })...),
			"alert_rule_test": []map[string]any{
				{"eval_time": "35m", "alertname": "IdemledgerTakeovers", "exp_alerts": []any{alert("IdemledgerTakeovers", map[string]string{"ledger_namespace": "billing", "severity": "ticket"}, "2")}},
			},
		},
	}
	dir := t.TempDir()
	test, err := yaml.Marshal(map[string]any{"rule_files": []string{"rules.yaml"}, "evaluation_interval": "1m", "tests": tests})
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"rules.yaml": ruleFile, "test.yaml": test} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("go", "tool", "promtool", "test", "rules", filepath.Join(dir, "test.yaml"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules: %v\n%s\nthe test:\n%s", err, out, test)
	}
}

// selector is name{labels} in PromQL's series notation.
func selector(name string, l map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(l)) {
		parts = append(parts, fmt.Sprintf("%s=%q", k, l[k]))
	}
	return name + "{" + strings.Join(parts, ",") + "}"
}

var templateField = regexp.MustCompile(`\{\{\s*(\$labels\.([a-z_]+)|\$value \| humanize)\s*\}\}`)

// expand fills an annotation's template as Prometheus would for an alert
// of labels and (humanized) value.
func expand(tmpl string, labels map[string]string, value string) string {
	return templateField.ReplaceAllStringFunc(tmpl, func(m string) string {
		sub := templateField.FindStringSubmatch(m)
		if sub[2] != "" {
			return labels[sub[2]]
		}
		return value
	})
}
