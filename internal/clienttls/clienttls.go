// Package clienttls is the TLS configuration of a client of ledgerd (the
// commands idemctl and idemproxy): the CA that ledgerd's certificate chains
// to, the client's own certificate for mutual TLS, and the name ledgerd's
// certificate must carry.
package clienttls

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// Options are the files and the name; empty ones are left out.
type Options struct {
	// CAFile is a PEM bundle of the CAs that ledgerd's certificate chains
	// to; empty: the system's.
	CAFile string
	// CertFile and KeyFile are the client's certificate and key (PEM), for
	// mutual TLS; both or neither.
	CertFile, KeyFile string
	// ServerName is the name ledgerd's certificate must carry; empty: the
	// host of the address dialed.
	ServerName string
}

// Config is the client's tls.Config.
func Config(o Options) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: o.ServerName}
	if o.CAFile != "" {
		pem, err := os.ReadFile(o.CAFile)
		if err != nil {
			return nil, fmt.Errorf("CA: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA: no certificate in %s", o.CAFile)
		}
	}
	if (o.CertFile == "") != (o.KeyFile == "") {
		return nil, errors.New("a client certificate and its key go together")
	}
	if o.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}
