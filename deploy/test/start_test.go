package test

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/idemledger/idemledger/internal/pgtest"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/server"
)

// What the manifests' ledgerd is started with, rewritten to run here: on
// loopback, each listening port moved to a free one (the probes follow it);
// the mounted Secrets and ConfigMaps as files in a directory of their own;
// the database URL a throwaway PostgreSQL database. Nothing else changes:
// the arguments and environment are those the manifests render.

// ledgerdBinary is ledgerd, built once; invoiceBinary the example invoice
// service that compose runs beside it; grpcurlBinary and idemctlBinary
// the grpcurl and idemctl that the runbook's commands call (grpcurl is a
// tool of this module).
var (
	ledgerdBinary = sync.OnceValues(func() (string, error) { return build("../../cmd/ledgerd") })
	invoiceBinary = sync.OnceValues(func() (string, error) { return build("../../examples/invoice/cmd/invoice-server") })
	grpcurlBinary = sync.OnceValues(func() (string, error) { return build("github.com/fullstorydev/grpcurl/cmd/grpcurl") })
	idemctlBinary = sync.OnceValues(func() (string, error) { return build("../../cmd/idemctl") })
)

// build builds the main package pkg into a temporary directory.
func build(pkg string) (string, error) {
	dir, err := os.MkdirTemp("", "deploy-bin")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, filepath.Base(pkg))
	if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %w\n%s", pkg, err, out)
	}
	return bin, nil
}

// world is what the rewritten containers find: the files of Secrets and
// ConfigMaps by name and key, and where each listening port moved.
type world struct {
	t     *testing.T
	files map[string]map[string]string // by Secret or ConfigMap name, then key
	ports map[string]string            // rendered port -> the loopback address it moved to
	// exited is the served ledgerd's end: the waits give up at it.
	exited <-chan struct{}
}

func newWorld(t *testing.T, objs map[string]any) *world {
	t.Helper()
	url := pgtest.NewDatabase(t)
	cert, key, ca := selfSigned(t)
	w := &world{t: t, ports: map[string]string{}, files: map[string]map[string]string{
		"ledgerd-tokens": {"tokens": server.HashToken("deploy-test-token") + " billing acme\n"},
		"ledgerd-certs":  {"certs": "cn:invoice-service billing acme\n"},
		"ledgerd-tls":    {"tls.crt": cert, "tls.key": key, "ca.crt": ca},
	}}
	for name, obj := range objs {
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			w.files[strings.TrimPrefix(name, "ConfigMap/")] = cm.Data
		}
	}
	for _, s := range []string{"ledgerd-database", "ledgerd-database-admin"} {
		w.files[s] = map[string]string{"url": url}
	}
	for _, r := range regions {
		w.files["ledgerd-database-"+r] = map[string]string{"url": url}
	}
	return w
}

// addr is where a rendered listening address moved: the same port always
// moves to the same free loopback port, and two ports never to one. A
// port is free once its probe listener closes, so the next probe may be
// given it again while nothing listens there yet (a CI run met two of
// ledgerd's listeners moved to one port): a port already given is passed
// over while its probe is still held.
func (w *world) addr(rendered string) string {
	_, port, err := net.SplitHostPort(rendered)
	if err != nil {
		w.t.Fatalf("a listening address %q: %v", rendered, err)
	}
	if a, ok := w.ports[port]; ok {
		return a
	}
	given := map[string]bool{}
	for _, a := range w.ports {
		given[a] = true
	}
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			w.t.Fatal(err)
		}
		defer l.Close()
		if a := l.Addr().String(); !given[a] {
			w.ports[port] = a
			return a
		}
	}
}

// mount writes a volume's files into a directory of their own.
func (w *world) mount(v corev1.Volume) string {
	w.t.Helper()
	var name string
	var items []corev1.KeyToPath
	switch {
	case v.Secret != nil:
		name, items = v.Secret.SecretName, v.Secret.Items
	case v.ConfigMap != nil:
		name, items = v.ConfigMap.Name, v.ConfigMap.Items
	default:
		w.t.Fatalf("volume %s: neither a Secret nor a ConfigMap", v.Name)
	}
	data, ok := w.files[name]
	if !ok {
		w.t.Fatalf("volume %s names %s, which this test does not provide", v.Name, name)
	}
	dir := w.t.TempDir()
	paths := map[string]string{}
	for k := range data {
		paths[k] = k
	}
	if len(items) > 0 {
		paths = map[string]string{}
		for _, it := range items {
			paths[it.Key] = it.Path
		}
	}
	for k, p := range paths {
		if err := os.WriteFile(filepath.Join(dir, p), []byte(data[k]), 0o600); err != nil {
			w.t.Fatal(err)
		}
	}
	return dir
}

// container is the command line and environment of a container, rewritten.
func (w *world) container(c corev1.Container, volumes []corev1.Volume) (args, env []string) {
	w.t.Helper()
	mounts := map[string]string{} // mount path -> directory here
	for _, m := range c.VolumeMounts {
		for _, v := range volumes {
			if v.Name == m.Name {
				mounts[m.MountPath] = w.mount(v)
			}
		}
	}
	rewrite := func(name, value string) string {
		if strings.HasSuffix(name, "listen") && value != "" {
			return w.addr(value)
		}
		for path, dir := range mounts {
			if rest, ok := strings.CutPrefix(value, path); ok {
				return dir + rest
			}
		}
		return value
	}
	for _, a := range c.Args {
		name, value, ok := strings.Cut(a, "=")
		if !ok {
			args = append(args, a)
			continue
		}
		args = append(args, name+"="+rewrite(name, value))
	}
	for _, e := range c.Env {
		value := e.Value
		switch {
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			v, ok := w.files[ref.Name][ref.Key]
			if !ok {
				w.t.Fatalf("env %s names Secret %s key %s, which this test does not provide", e.Name, ref.Name, ref.Key)
			}
			value = v
		case e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil:
			q := c.Resources.Limits[corev1.ResourceName(strings.TrimPrefix(e.ValueFrom.ResourceFieldRef.Resource, "limits."))]
			value = fmt.Sprint(q.Value())
		case e.ValueFrom != nil:
			w.t.Fatalf("env %s: a source this test does not provide", e.Name)
		}
		env = append(env, e.Name+"="+rewrite(e.Name, value))
	}
	return args, env
}

// proc is a started ledgerd: its log, and its end.
type proc struct {
	log    *lines
	exited chan struct{} // closed when it ended, err set
	err    error
}

// run starts ledgerd with args and env (and nothing else of this
// process's environment); it is killed when the test ends.
func run(t *testing.T, args, env []string) *proc {
	t.Helper()
	return runBinary(t, ledgerdBinary, args, env)
}

// runBinary is run for the binary that binary builds.
func runBinary(t *testing.T, binary func() (string, error), args, env []string) *proc {
	t.Helper()
	bin, err := binary()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env, cmd.Dir = env, t.TempDir()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{log: &lines{}, exited: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.log.add(sc.Text())
		}
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("%s %s:\n%s", filepath.Base(bin), strings.Join(args, " "), p.log.String())
		}
	})
	return p
}

// migrate runs a migration Job's container to its end.
func (w *world) migrate(job *batchv1.Job) {
	w.t.Helper()
	spec := job.Spec.Template.Spec
	args, env := w.container(spec.Containers[0], spec.Volumes)
	p := run(w.t, args, env)
	select {
	case <-p.exited:
		if p.err != nil {
			w.t.Fatalf("Job %s: %v\n%s", job.Name, p.err, p.log.String())
		}
	case <-time.After(60 * time.Second):
		w.t.Fatalf("Job %s did not end within 60 s", job.Name)
	}
}

// serve starts a Deployment's ledgerd and checks its probes: the startup
// and readiness probes' gRPC health is SERVING, and the liveness probe's
// HTTP path answers 200, on the ports they name.
func (w *world) serve(d *appsv1.Deployment) {
	w.t.Helper()
	w.ports = map[string]string{} // a pod's network of its own
	spec := d.Spec.Template.Spec
	c := spec.Containers[0]
	args, env := w.container(c, spec.Volumes)
	w.exited = run(w.t, args, env).exited
	named := map[string]string{}
	for _, p := range c.Ports {
		named[p.Name] = fmt.Sprint(p.ContainerPort)
	}
	port := func(p fmt.Stringer) string {
		if n, ok := named[p.String()]; ok {
			return n
		}
		return p.String()
	}
	for what, probe := range map[string]*corev1.Probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		switch {
		case probe == nil:
			w.t.Errorf("%s: no %s probe", d.Name, what)
		case probe.GRPC != nil:
			service := ""
			if probe.GRPC.Service != nil {
				service = *probe.GRPC.Service
			}
			w.waitServing(d.Name+" "+what, w.ports[fmt.Sprint(probe.GRPC.Port)], service)
		case probe.HTTPGet != nil:
			w.waitHTTP(d.Name+" "+what, "http://"+w.ports[port(&probe.HTTPGet.Port)]+probe.HTTPGet.Path)
		default:
			w.t.Errorf("%s: the %s probe is neither gRPC nor HTTP", d.Name, what)
		}
	}
}

// waitServing waits up to 60 s for gRPC health of service at addr to say
// SERVING.
func (w *world) waitServing(what, addr, service string) {
	w.t.Helper()
	if addr == "" {
		w.t.Errorf("%s: the probe's port is none that ledgerd listens on", what)
		return
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		w.t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(w.t.Context(), 60*time.Second)
	defer cancel()
	exited := w.exited // read here: the next serve sets the field while this goroutine may still run
	go func() {
		select {
		case <-exited: // it will never say SERVING
			cancel()
		case <-ctx.Done():
		}
	}()
	// Watch sends the status as it is, then each change: no polling.
	stream, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: service}, grpc.WaitForReady(true))
	var res *healthpb.HealthCheckResponse
	for err == nil {
		if res, err = stream.Recv(); err == nil && res.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
	}
	w.t.Errorf("%s: gRPC health of %q on %s never said SERVING: %v, %v", what, service, addr, res, err)
}

// ended reports whether the served ledgerd has ended.
func (w *world) ended() bool {
	select {
	case <-w.exited:
		return true
	default:
		return false
	}
}

// waitHTTP waits up to 60 s for url to answer 200.
func (w *world) waitHTTP(what, url string) {
	w.t.Helper()
	ok := false
	// Poll the other process until it answers, or has ended.
	ledgertest.Eventually(w.t, 60*time.Second, func() bool {
		res, err := http.Get(url)
		if err == nil {
			res.Body.Close()
			ok = res.StatusCode == http.StatusOK
		}
		return ok || w.ended()
	}, "%s: %s answers 200", what, url)
	if !ok {
		w.t.Errorf("%s: %s never answered 200: ledgerd ended", what, url)
	}
}

// TestOverlaysStartLedgerd starts each overlay's migration Job and
// ledgerd Deployments with the arguments and environment they render,
// and checks that each becomes ready on its probes.
func TestOverlaysStartLedgerd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs ledgerd on PostgreSQL")
	}
	overlays := []string{"single-region", "multi-region/stretched"}
	for _, r := range regions {
		overlays = append(overlays, "multi-region/per-cluster/"+r)
	}
	for _, o := range overlays {
		t.Run(o, func(t *testing.T) {
			objs := render(t, "../kubernetes/overlays/"+o)
			w := newWorld(t, objs)
			n := 0
			for name, obj := range objs {
				if job, ok := obj.(*batchv1.Job); ok && strings.HasPrefix(name, "Job/ledgerd-migrate") {
					w.migrate(job)
				}
			}
			for _, obj := range objs {
				if d, ok := obj.(*appsv1.Deployment); ok {
					n++
					w.serve(d)
				}
			}
			if n == 0 {
				t.Fatal("no Deployment")
			}
		})
	}
}

// TestComposeStartsLedgerd starts the compose file's migrate and ledgerd
// services with their commands and environment (the secrets mounted as
// compose mounts them), and checks that ledgerd becomes ready: /readyz
// on its admin port, and gRPC health on its health port.
func TestComposeStartsLedgerd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs ledgerd on PostgreSQL")
	}
	startCompose(t, false)
}

// composeService is what the tests take of a compose service.
type composeService struct {
	Command     []string          `json:"command"`
	Environment map[string]string `json:"environment"`
	Secrets     []string          `json:"secrets"`
	Ports       []string          `json:"ports"`
}

// startCompose runs the compose file's migrate service, then starts its
// ledgerd (and, with invoice, its invoice service) and waits until they
// are ready. It returns where each published port (localhost:<port>) moved.
func startCompose(t *testing.T, invoice bool) map[string]string {
	t.Helper()
	b, err := os.ReadFile("../docker/compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]any `json:"services"`
		Secrets  map[string]struct {
			File string `json:"file"`
		} `json:"secrets"`
	}
	if err := yaml.Unmarshal(b, &compose); err != nil {
		t.Fatal(err)
	}
	url := pgtest.NewDatabase(t)
	ports := map[string]string{}
	w := &world{t: t, ports: ports}
	container := func(s composeService) (args, env []string) {
		secrets := t.TempDir()
		for _, name := range s.Secrets {
			data, err := os.ReadFile(filepath.Join("../docker", compose.Secrets[name].File))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(secrets, name), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		rewrite := func(name, value string) string {
			switch {
			case strings.HasSuffix(name, "LISTEN"):
				return w.addr(value)
			case strings.HasPrefix(value, "postgres://"):
				return url
			case strings.HasPrefix(value, "/run/secrets/"):
				return filepath.Join(secrets, strings.TrimPrefix(value, "/run/secrets/"))
			case name == "INVOICE_LEDGER": // ledgerd's service name and port
				_, port, _ := net.SplitHostPort(value)
				return ports[port]
			}
			return value
		}
		for i := 0; i < len(s.Command); i++ {
			a := s.Command[i]
			if a == "--database-url" && i+1 < len(s.Command) {
				args = append(args, a, rewrite(a, s.Command[i+1]))
				i++
				continue
			}
			args = append(args, a)
		}
		for k, v := range s.Environment {
			env = append(env, k+"="+rewrite(k, v))
		}
		return args, env
	}
	decode := func(name string) composeService {
		t.Helper()
		b, err := yaml.Marshal(compose.Services[name])
		if err != nil {
			t.Fatal(err)
		}
		var s composeService
		if err := yaml.Unmarshal(b, &s); err != nil {
			t.Fatalf("compose service %s: %v", name, err)
		}
		return s
	}
	args, env := container(decode("migrate"))
	p := run(t, args, env)
	if <-p.exited; p.err != nil {
		t.Fatalf("migrate: %v\n%s", p.err, p.log.String())
	}
	ledgerd := decode("ledgerd")
	args, env = container(ledgerd)
	w.exited = run(t, args, env).exited
	for k, v := range ledgerd.Environment {
		_, port, _ := net.SplitHostPort(v)
		switch k {
		case "LEDGER_ADMIN_LISTEN":
			w.waitHTTP("compose ledgerd", "http://"+ports[port]+"/readyz")
		case "LEDGER_HEALTH_LISTEN":
			w.waitServing("compose ledgerd", ports[port], "idemledger.v1.LedgerService")
		}
	}
	published := map[string]string{} // localhost:<host port> -> where its container port moved
	publish := func(s composeService) {
		for _, p := range s.Ports {
			host, container, _ := strings.Cut(p, ":")
			if ports[container] == "" {
				t.Fatalf("compose publishes %s, on which nothing listens", p)
			}
			published["localhost:"+host] = ports[container]
		}
	}
	publish(ledgerd)
	if invoice {
		s := decode("invoice")
		args, env := container(s)
		w.exited = runBinary(t, invoiceBinary, args, env).exited
		publish(s)
		for _, p := range s.Ports {
			host, _, _ := strings.Cut(p, ":")
			w.waitServing("compose invoice", published["localhost:"+host], "")
		}
	}
	return published
}

// selfSigned is a CA and a server certificate for 127.0.0.1 it signed, as
// PEM: the certificate, its key, and the CA.
func selfSigned(t *testing.T) (cert, key, ca string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "deploy-test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	srvTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "ledgerd"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		t.Fatal(err)
	}
	enc := func(typ string, der []byte) string {
		return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
	}
	return enc("CERTIFICATE", srvDER), enc("EC PRIVATE KEY", keyDER), enc("CERTIFICATE", caDER)
}
