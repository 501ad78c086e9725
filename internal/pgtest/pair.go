package pgtest

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"syscall"
)

// Pair is a primary and a standby that streams its write-ahead log, two
// clusters on loopback, for failover tests: Fail kills the primary and
// promotes the standby, Rejoin makes the old primary the new one's
// standby. Durability is on (every commit flushed); with synchronous
// replication a commit is acknowledged once the standby has it too.
type Pair struct {
	// Primary and Standby are the clusters in their current roles.
	Primary, Standby *Cluster
	sync             bool
}

// StartPair starts a primary and its standby; sync makes the replication
// synchronous (synchronous_standby_names = '*', synchronous_commit = on).
// Stop it when done.
func StartPair(sync bool) (*Pair, error) {
	primary, err := start(true)
	if err != nil {
		return nil, err
	}
	p := &Pair{Primary: primary, sync: sync}
	if err := p.configure(primary); err != nil {
		primary.Stop()
		return nil, err
	}
	if err := primary.run("pg_ctl", "-D", primary.data, "-l", filepath.Join(primary.dir, "log"), "-m", "fast", "-w", "-t", "60", "restart"); err != nil {
		primary.Stop()
		return nil, err
	}
	if p.Standby, err = p.standbyOf(primary, nil); err != nil {
		primary.Stop()
		return nil, err
	}
	return p, nil
}

// configure writes the replication settings of a primary to be.
func (p *Pair) configure(c *Cluster) error {
	conf := "wal_level = replica\nmax_wal_senders = 10\nwal_keep_size = '256MB'\nhot_standby = on\n"
	if p.sync {
		conf += "synchronous_standby_names = '*'\nsynchronous_commit = on\n"
	} else {
		conf += "synchronous_standby_names = ''\n"
	}
	return appendConf(c.data, conf)
}

// standbyOf makes a standby of primary: into old's directory and port when
// old is given (the old primary rejoining), or a new cluster's.
func (p *Pair) standbyOf(primary, old *Cluster) (*Cluster, error) {
	c := old
	if c == nil {
		dir, err := os.MkdirTemp("", "idemledger-pg-")
		if err != nil {
			return nil, err
		}
		if os.Geteuid() == 0 {
			if err := chownToPostgres(dir); err != nil {
				return nil, err
			}
		}
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		c = &Cluster{URL: fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port), run: primary.run,
			data: filepath.Join(dir, "data"), dir: dir}
	}
	_ = c.run("pg_ctl", "-D", c.data, "-m", "immediate", "-w", "stop") // the old primary, if it runs
	if err := os.RemoveAll(c.data); err != nil {
		return nil, err
	}
	u, err := url.Parse(primary.URL)
	if err != nil {
		return nil, err
	}
	if err := c.run("pg_basebackup", "-h", u.Hostname(), "-p", u.Port(), "-U", "postgres", "-D", c.data, "-R", "-X", "stream", "-c", "fast", "--no-sync"); err != nil {
		return nil, err
	}
	cu, err := url.Parse(c.URL)
	if err != nil {
		return nil, err
	}
	// The copy has the primary's settings: its own port, socket and log.
	if err := appendConf(c.data, fmt.Sprintf("port = %s\nunix_socket_directories = '%s'\n", cu.Port(), c.dir)); err != nil {
		return nil, err
	}
	if err := c.run("pg_ctl", "-D", c.data, "-l", filepath.Join(c.dir, "log"), "-w", "-t", "60", "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(c.dir, "log"))
		return nil, fmt.Errorf("%w\n%s", err, log)
	}
	return c, ping(c.URL)
}

// URL is a multi-host URL of database db on both clusters that connects
// to whichever is the primary (target_session_attrs=read-write).
func (p *Pair) URL(db string) string {
	a, _ := url.Parse(p.Primary.URL)
	b, _ := url.Parse(p.Standby.URL)
	return fmt.Sprintf("postgres://postgres@%s,%s/%s?sslmode=disable&target_session_attrs=read-write", a.Host, b.Host, db)
}

// CreateDatabase creates database name on the primary (the standby
// replays it).
func (p *Pair) CreateDatabase(name string) error {
	return psql(p.Primary.URL, "CREATE DATABASE "+name)
}

// Fail kills the primary's postmaster with SIGKILL and promotes the
// standby, which becomes the primary; the old one is down until Rejoin.
func (p *Pair) Fail() error {
	pid, err := p.Primary.PID()
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return err
	}
	if err := p.Standby.run("pg_ctl", "-D", p.Standby.data, "-w", "-t", "60", "promote"); err != nil {
		return err
	}
	p.Primary, p.Standby = p.Standby, p.Primary
	return nil
}

// Rejoin makes the failed old primary a standby of the new one, from a
// fresh base backup, so that a synchronous primary can acknowledge
// commits again and the pair can fail over once more.
func (p *Pair) Rejoin() error {
	// The killed postmaster's children may still hold its port and its
	// shared memory a moment: pg_ctl stop -m immediate ends them.
	c, err := p.standbyOf(p.Primary, p.Standby)
	if err != nil {
		return err
	}
	p.Standby = c
	return nil
}

// Stop stops both clusters and removes their directories.
func (p *Pair) Stop() {
	p.Primary.Stop()
	if p.Standby != nil {
		p.Standby.Stop()
	}
}

// appendConf appends settings to the cluster's postgresql.auto.conf.
func appendConf(data, conf string) error {
	f, err := os.OpenFile(filepath.Join(data, "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("configure the cluster: %w", err)
	}
	_, err = f.WriteString(conf)
	return errors.Join(err, f.Close())
}
