// Package pgtest gives tests a real PostgreSQL: Main starts a throwaway
// cluster for a test binary (unless LEDGER_TEST_DATABASE_URL names a
// database), and NewDatabase hands each test a fresh database in it. It
// drives PostgreSQL's own programs (initdb, pg_ctl, pg_isready, psql) and
// imports no driver, so that any module's tests may use it.
//
// The cluster runs from a temporary directory that holds its data, socket
// and log, listens on 127.0.0.1 on a free port, and is stopped and removed
// when the tests end. As root, initdb and pg_ctl run as the postgres user
// through runuser (PostgreSQL refuses to run as root). Durability is off
// (fsync, synchronous_commit): the tests check logic, not disks.
//
// Without PostgreSQL the tests skip with a message, except under CI=true,
// where they fail.
package pgtest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// EnvURL names an existing database to test against instead of a
// throwaway cluster.
const EnvURL = "LEDGER_TEST_DATABASE_URL"

var (
	baseURL     string
	unavailable error
)

// Main runs the tests of a package with PostgreSQL available and exits:
// call it from TestMain.
func Main(m *testing.M) { os.Exit(Run(m)) }

// Run is Main for a TestMain that has more to do: it returns the exit code.
func Run(m *testing.M) int {
	var stop func()
	if u := os.Getenv(EnvURL); u != "" {
		baseURL = u
	} else {
		c, err := StartCluster()
		if err != nil {
			unavailable = err
			fmt.Fprintf(os.Stderr, "pgtest: no PostgreSQL for these tests: %v\n", err)
		} else {
			baseURL, stop = c.URL, c.Stop
		}
	}
	code := m.Run()
	if stop != nil {
		stop()
	}
	return code
}

// NewDatabase returns the URL of a database created for the test and
// dropped after it. Without PostgreSQL it skips the test, or fails it when
// CI=true.
func NewDatabase(t testing.TB) string {
	t.Helper()
	if baseURL == "" {
		msg := fmt.Sprintf("PostgreSQL is not available (%v); install postgresql-15 or set %s", unavailable, EnvURL)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "idemledger_test_" + hex.EncodeToString(b)
	if err := psql(baseURL, "CREATE DATABASE "+name); err != nil {
		t.Logf("cannot create a database (%v); using %s as it is", err, EnvURL)
		return baseURL
	}
	t.Cleanup(func() { _ = psql(baseURL, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)") })
	u, err := url.Parse(baseURL)
	if err != nil {
		t.Fatalf("parse %s: %v", EnvURL, err)
	}
	u.Path = "/" + name
	return u.String()
}

// Cluster is a throwaway PostgreSQL cluster in a temporary directory.
type Cluster struct {
	URL  string // of its postgres database
	run  func(name string, args ...string) error
	data string
	dir  string
}

// StartCluster initialises and starts a cluster without durability
// (fsync, synchronous_commit and full_page_writes off): tests check logic,
// not disks. Stop it when done.
func StartCluster() (*Cluster, error) { return start(false) }

// StartDurableCluster is StartCluster with PostgreSQL's durability settings
// left at their defaults (every commit flushed to disk), for benchmarks.
func StartDurableCluster() (*Cluster, error) { return start(true) }

func start(durable bool) (*Cluster, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "idemledger-pg-")
	if err != nil {
		return nil, err
	}
	run := func(name string, args ...string) error {
		cmd := exec.Command(filepath.Join(bin, name), args...)
		if os.Geteuid() == 0 {
			cmd = exec.Command("runuser", append([]string{"-u", "postgres", "--", filepath.Join(bin, name)}, args...)...)
		}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s: %w: %s", name, err, out.String())
		}
		return nil
	}
	if os.Geteuid() == 0 {
		if err := chownToPostgres(dir); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	data := filepath.Join(dir, "data")
	if err := run("initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	// The options live in the data directory, so a restart keeps them.
	conf := fmt.Sprintf("listen_addresses = '127.0.0.1'\nport = %d\nunix_socket_directories = '%s'\n"+
		"max_connections = 300\nmax_pred_locks_per_transaction = 256\n", port, dir)
	if !durable {
		conf += "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
	}
	f, err := os.OpenFile(filepath.Join(data, "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(conf)
		_ = f.Close()
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("configure the cluster: %w", err)
	}
	c := &Cluster{URL: fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port), run: run, data: data, dir: dir}
	if err := run("pg_ctl", "-D", data, "-l", filepath.Join(dir, "log"), "-w", "-t", "60", "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "log"))
		os.RemoveAll(dir)
		return nil, fmt.Errorf("%w\n%s", err, log)
	}
	if err := ping(c.URL); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// PID is the process id of the cluster's postmaster, the parent of its
// other processes.
func (c *Cluster) PID() (int, error) {
	b, err := os.ReadFile(filepath.Join(c.data, "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	first, _, _ := bytes.Cut(b, []byte("\n"))
	return strconv.Atoi(string(bytes.TrimSpace(first)))
}

// Restart stops the cluster (fast: open connections are cut) and starts it
// again.
func (c *Cluster) Restart() error {
	return c.run("pg_ctl", "-D", c.data, "-l", filepath.Join(c.dir, "log"), "-m", "fast", "-w", "-t", "60", "restart")
}

// Stop stops the cluster and removes its directory.
func (c *Cluster) Stop() {
	_ = c.run("pg_ctl", "-D", c.data, "-m", "immediate", "-w", "stop")
	os.RemoveAll(c.dir)
}

// NewCluster starts a cluster of the test's own, stopped when the test
// ends: for tests that restart PostgreSQL. Without PostgreSQL it skips the
// test, or fails it when CI=true.
func NewCluster(t testing.TB) *Cluster {
	t.Helper()
	c, err := StartCluster()
	if err != nil {
		msg := fmt.Sprintf("cannot start PostgreSQL (%v); install postgresql-15", err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	t.Cleanup(c.Stop)
	return c
}

func binDir() (string, error) {
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(matches) > 0 {
		return filepath.Dir(matches[len(matches)-1]), nil
	}
	p, err := exec.LookPath("initdb")
	if err != nil {
		return "", errors.New("initdb not found (apt-get install postgresql-15)")
	}
	return filepath.Dir(p), nil
}

func chownToPostgres(dir string) error {
	u, err := user.Lookup("postgres")
	if err != nil {
		return fmt.Errorf("running as root needs the postgres user: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return os.Chown(dir, uid, gid)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ping waits for the cluster at u to accept connections.
func ping(u string) error {
	bin, err := binDir()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := exec.Command(filepath.Join(bin, "pg_isready"), "-d", u).CombinedOutput()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("PostgreSQL did not answer: %w: %s", err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// psql runs one SQL command against the database at u.
func psql(u, command string) error {
	bin, err := binDir()
	if err != nil {
		return err
	}
	out, err := exec.Command(filepath.Join(bin, "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", u, "-c", command).CombinedOutput()
	if err != nil {
		return fmt.Errorf("psql: %w: %s", err, out)
	}
	return nil
}
