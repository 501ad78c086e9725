package test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"sigs.k8s.io/yaml"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/internal/pgtest"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// rules are the PrometheusRule's groups of an overlay, as Prometheus
// reads a rule file.
func rules(t *testing.T, overlay string) ([]byte, *monitoringv1.PrometheusRule) {
	t.Helper()
	objs := render(t, overlay)
	pr, ok := objs["PrometheusRule/ledgerd"].(*monitoringv1.PrometheusRule)
	if !ok {
		t.Fatalf("%s has no PrometheusRule/ledgerd", overlay)
	}
	b, err := yaml.Marshal(map[string]any{"groups": pr.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	return b, pr
}

// TestAlertRulesParse: the PrometheusRule's groups are a rule file that
// Prometheus' own parser accepts (expressions, durations, templates), and
// they hold the runbook's alerts: in one region, Begin's p99 above 50 ms;
// in several, the claims' p99 by home region above 150 ms instead.
func TestAlertRulesParse(t *testing.T) {
	for overlay, slow := range map[string]string{
		"../kubernetes/overlays/single-region":                     "IdemledgerBeginSlow",
		"../kubernetes/overlays/multi-region/per-cluster/us-east1": "IdemledgerHomeSlow",
	} {
		t.Run(slow, func(t *testing.T) { alertRulesParse(t, overlay, slow) })
	}
}

func alertRulesParse(t *testing.T, overlay, slow string) {
	file, pr := rules(t, overlay)
	groups, errs := rulefmt.Parse(file, false, model.LegacyValidation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		t.Fatalf("Prometheus refuses the rules: %v\n%s", errs, file)
	}
	var alerts []string
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" || r.Labels["severity"] == "" {
				t.Errorf("alert %s lacks a summary, a description or a severity", r.Alert)
			}
		}
	}
	for _, want := range []string{"IdemledgerUnavailable", "IdemledgerInternalErrors", slow, "IdemledgerTakeovers",
		"IdemledgerLeaseLost", "IdemledgerOutcomeUnknown", "IdemledgerNotReady", "IdemledgerDown"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("no alert %s", want)
		}
	}
	if slow == "IdemledgerHomeSlow" && slices.Contains(alerts, "IdemledgerBeginSlow") {
		t.Error("the multi-region rules keep the single-region Begin alert")
	}
	checkMetricNames(t, "the alert rules", exprsOfRules(pr), exportedMetrics(t))
}

func exprsOfRules(pr *monitoringv1.PrometheusRule) []string {
	var exprs []string
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr.String())
		}
	}
	return exprs
}

// grafanaVariables are the dashboard's variables, as Grafana would fill
// them in before it sends a query.
var grafanaVariables = strings.NewReplacer("$__rate_interval", "5m", "$namespace", ".*", "${datasource}", "prometheus")

// TestDashboard: the Grafana dashboard is JSON with a panel per query,
// every query parses as PromQL once its variables are filled in, and
// every metric it reads is one ledgerd exports.
func TestDashboard(t *testing.T) {
	b, err := os.ReadFile("../grafana/ledgerd.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	if dash.Title == "" || dash.UID == "" || len(dash.Panels) < 8 {
		t.Fatalf("dashboard %q (%s) with %d panels", dash.Title, dash.UID, len(dash.Panels))
	}
	var exprs []string
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, grafanaVariables.Replace(tg.Expr))
		}
	}
	checkMetricNames(t, "the dashboard", exprs, exportedMetrics(t))
}

// checkMetricNames parses each expression and fails for a metric that
// ledgerd does not export.
func checkMetricNames(t *testing.T, what string, exprs []string, exported map[string]string) {
	t.Helper()
	p := parser.NewParser(parser.Options{})
	for _, e := range exprs {
		expr, err := p.ParseExpr(e)
		if err != nil {
			t.Errorf("%s: %q does not parse: %v", what, e, err)
			continue
		}
		parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
			vs, ok := node.(*parser.VectorSelector)
			if !ok {
				return nil
			}
			if vs.Name == "up" {
				return nil // Prometheus' own
			}
			if !exports(exported, vs.Name) {
				t.Errorf("%s reads %s, which ledgerd does not export", what, vs.Name)
			}
			return nil
		})
	}
}

// exports reports whether name is a series of an exported family: the
// family itself, or a histogram's _bucket, _sum or _count.
func exports(families map[string]string, name string) bool {
	if _, ok := families[name]; ok {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && families[base] == "histogram" {
			return true
		}
	}
	return false
}

var exported map[string]string

// exportedMetrics runs ledgerd on PostgreSQL (so that the SQL batch
// metrics are there) and on its embedded store (the Pebble metrics), makes
// a claim, a completion and a replay on each, and returns the metric
// families on their /metrics with their types: a rule or a panel may read
// what either exports.
func exportedMetrics(t *testing.T) map[string]string {
	t.Helper()
	if exported != nil {
		return exported
	}
	if testing.Short() {
		t.Skip("builds and runs ledgerd on PostgreSQL and on its embedded store")
	}
	bin := filepath.Join(t.TempDir(), "ledgerd")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/ledgerd").CombinedOutput(); err != nil {
		t.Fatalf("build ledgerd: %v\n%s", err, out)
	}
	all := map[string]string{}
	for store, c := range map[string]struct {
		args []string
		want string
	}{
		"PostgreSQL": {[]string{"--database-url", pgtest.NewDatabase(t), "--migrate"}, "idemledger_sql_batches_total"},
		"embedded":   {[]string{"--data-dir", t.TempDir()}, "idemledger_pebble_wal_sync_seconds"},
	} {
		families := ledgerdFamilies(t, bin, store, c.args...)
		for _, want := range []string{"idemledger_decisions_total", "idemledger_store_seconds", "idemledger_records", c.want} {
			if _, ok := families[want]; !ok {
				t.Fatalf("ledgerd on %s does not export %s", store, want)
			}
		}
		maps.Copy(all, families)
	}
	exported = all
	return exported
}

// ledgerdFamilies runs bin with args, claims, completes and replays a key,
// waits for the census, and returns the families on its /metrics.
func ledgerdFamilies(t *testing.T, bin, store string, args ...string) map[string]string {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--http-listen", "",
		"--census-interval", "100ms"}, args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addrs := make(chan [2]string, 1)
	var logged lines
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			logged.add(sc.Text())
			var line struct{ Msg, GRPC, Admin string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "ledgerd listening" {
				addrs <- [2]string{line.GRPC, line.Admin}
			}
		}
	}()
	var grpcAddr, admin string
	select {
	case a := <-addrs:
		grpcAddr, admin = a[0], a[1]
	case <-time.After(30 * time.Second):
		t.Fatalf("ledgerd on %s did not listen", store)
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := ledgerv1.NewLedgerServiceClient(conn)
	req := &ledgerv1.BeginRequest{Tenant: "acme", Key: "k", Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := client.Begin(ctx, req, grpc.WaitForReady(true)) // the other process may still be starting
	if err != nil {
		t.Fatal(err)
	}
	out := &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Status{Status: &ledgerv1.StoredStatus{Code: 9, Message: "declined"}}}
	if _, err := client.Complete(ctx, &ledgerv1.CompleteRequest{Tenant: "acme", Key: "k", Token: res.GetClaim().GetToken(), Outcome: out}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Begin(ctx, req); err != nil {
		t.Fatal(err)
	}
	// The census runs as soon as the store is open and every 100ms after;
	// on a loaded machine the first may take a while.
	var body []byte
	ledgertest.Eventually(t, 20*time.Second, func() bool {
		if body, err = scrape("http://" + admin + "/metrics"); err != nil {
			t.Fatal(err)
		}
		return regexp.MustCompile(`(?m)^idemledger_records\{`).Match(body)
	}, "the census's idemledger_records on %s", store)
	if strings.Contains(logged.String(), "census failed") {
		t.Fatalf("the census failed on %s:\n%s", store, logged.String())
	}
	families := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^# TYPE (\S+) (\S+)$`).FindAllStringSubmatch(string(body), -1) {
		families[m[1]] = m[2]
	}
	return families
}

func scrape(url string) ([]byte, error) {
	res, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	return io.ReadAll(res.Body)
}

// lines is a log kept for a failure message.
type lines struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lines) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.WriteString(s)
	l.b.WriteByte('\n')
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
