package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idemledger/idemledger/server"
)

// credentialSet is what ledgerd authenticates with: the token and
// certificate principal files, the server's certificate and the client
// CA. load reads them all and swaps them in at once, so SIGHUP rotates
// any of them without a restart; a load that fails keeps the set in force.
type credentialSet struct {
	cfg  config
	log  *slog.Logger
	auth atomic.Pointer[server.Authenticator]
	tls  atomic.Pointer[tls.Config] // nil without --tls-cert
}

func newCredentialSet(cfg config, log *slog.Logger) (*credentialSet, error) {
	cs := &credentialSet{cfg: cfg, log: log}
	if err := cs.load(); err != nil {
		return nil, err
	}
	if cfg.devMode() {
		log.Warn("DEV MODE: no --tokens or --certs, so every caller is namespace \"dev\" with every tenant; loopback only, never in production", "listen", cfg.listen)
	} else if cfg.tlsCert == "" && cfg.tokensFile != "" && !loopback(cfg.listen) {
		log.Warn("bearer tokens travel in plaintext: set --tls-cert and --tls-key unless a proxy terminates TLS in front of ledgerd")
	}
	return cs, nil
}

// load reads every credentials file and swaps the result in.
func (cs *credentialSet) load() error {
	cfg := cs.cfg
	var auth server.Authenticator
	if cfg.devMode() {
		dev := server.Principal{Namespace: "dev", Tenants: []string{"*"}, Admin: "dev"}
		auth = server.AuthenticatorFunc(func(context.Context) (server.Principal, error) { return dev, nil })
	} else {
		var auths []server.Authenticator
		if cfg.tokensFile != "" {
			t, err := server.LoadTokens(cfg.tokensFile)
			if err != nil {
				return fmt.Errorf("tokens: %w", err)
			}
			auths = append(auths, t)
		}
		if cfg.certsFile != "" {
			c, err := server.LoadCertificates(cfg.certsFile)
			if err != nil {
				return fmt.Errorf("certs: %w", err)
			}
			auths = append(auths, c)
		}
		auth = server.AnyOf(auths...)
	}
	var tc *tls.Config
	if cfg.tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(cfg.tlsCert, cfg.tlsKey)
		if err != nil {
			return fmt.Errorf("tls: %w", err)
		}
		tc = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}
		if cfg.clientCA != "" {
			pem, err := os.ReadFile(cfg.clientCA)
			if err != nil {
				return fmt.Errorf("client CA: %w", err)
			}
			tc.ClientCAs = x509.NewCertPool()
			if !tc.ClientCAs.AppendCertsFromPEM(pem) {
				return fmt.Errorf("client CA: no certificate in %s", cfg.clientCA)
			}
			// With tokens as another way in, a certificate is verified when
			// given; without them it is required.
			tc.ClientAuth = tls.RequireAndVerifyClientCert
			if cfg.tokensFile != "" {
				tc.ClientAuth = tls.VerifyClientCertIfGiven
			}
		}
	}
	cs.auth.Store(&auth)
	cs.tls.Store(tc)
	return nil
}

// reload is load on SIGHUP: it logs what happened.
func (cs *credentialSet) reload(ctx context.Context) {
	if err := cs.load(); err != nil {
		cs.log.ErrorContext(ctx, "credentials not reloaded: keeping those in force", "error", err)
		return
	}
	cs.log.InfoContext(ctx, "credentials reloaded", "tokens", cs.cfg.tokensFile, "certs", cs.cfg.certsFile, "tls_cert", cs.cfg.tlsCert, "client_ca", cs.cfg.clientCA)
}

// authenticator authenticates with the principals in force.
func (cs *credentialSet) authenticator() server.Authenticator {
	return server.AuthenticatorFunc(func(ctx context.Context) (server.Principal, error) {
		return (*cs.auth.Load()).Authenticate(ctx)
	})
}

// transport is plaintext without --tls-cert (loopback, or behind a proxy
// that terminates TLS), and otherwise TLS with the certificate and client
// CA in force for each new connection.
func (cs *credentialSet) transport() credentials.TransportCredentials {
	if cs.tls.Load() == nil {
		return insecure.NewCredentials()
	}
	return credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return cs.tls.Load(), nil
		},
	})
}

// httpTLS is the HTTP listener's TLS configuration: nil without
// --tls-cert; otherwise the certificate and client CA in force for each
// new connection, offering HTTP/2 and HTTP/1.1.
func (cs *credentialSet) httpTLS() *tls.Config {
	if cs.tls.Load() == nil {
		return nil
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			c := cs.tls.Load().Clone()
			c.NextProtos = []string{"h2", "http/1.1"}
			return c, nil
		},
	}
}

// adminTLS is the admin listener's TLS configuration: nil without
// --admin-tls; otherwise the certificate in force, HTTP/1.1 and HTTP/2,
// and a client certificate verified against the client CA when one is
// given but never required, so that probes and scrapers without one still
// connect. Only the console reads the certificate.
func (cs *credentialSet) adminTLS() *tls.Config {
	if !cs.cfg.adminTLS {
		return nil
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			c := cs.tls.Load().Clone()
			c.NextProtos = []string{"h2", "http/1.1"}
			if c.ClientCAs != nil {
				c.ClientAuth = tls.VerifyClientCertIfGiven
			}
			return c, nil
		},
	}
}
