// Command idemctl is the operator's client of ledgerd's AdminService: it
// lists, reads, resolves and purges records, and makes token-file entries.
//
//	idemctl [flags] list --namespace billing [--tenant acme] [--state outcome_unknown] [--all]
//	idemctl [flags] get --namespace billing --tenant acme --key k-1
//	idemctl [flags] resolve --namespace billing --tenant acme --key k-1 (--not-applied | --applied '<Outcome JSON>')
//	idemctl [flags] purge --namespace billing --tenant acme (--key k-1 | --all-records --yes)
//	idemctl hash-token [--namespace billing --tenants acme] < token
//
// Every flag --some-name can also be set as IDEMCTL_SOME_NAME. The global
// flags: --addr (127.0.0.1:7070), --token or --token-file (an admin
// principal's bearer token), --tls with --ca, --cert and --key, -o table or
// json, --timeout. Exit status: 0, 1 when ledgerd refuses or fails, 2 for a
// usage error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/peterbourgon/ff/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/internal/buildinfo"
	"github.com/idemledger/idemledger/internal/clienttls"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// usageError is a mistake in the command line: exit 2.
type usageError struct{ error }

// global are the flags before the command.
type global struct {
	addr, token, tokenFile, ca, cert, key, serverName, output string
	tls                                                       bool
	timeout                                                   time.Duration
}

// usage is idemctl's help: its commands, then its flags.
var usage = func() string {
	var b strings.Builder
	b.WriteString("usage: idemctl [flags] <command> [flags]\n\ncommands:\n")
	for _, c := range []string{"list", "get", "resolve", "purge", "backup", "hash-token"} {
		fmt.Fprintf(&b, "  %-11s %s\n", c, commands[c])
	}
	b.WriteString("  help        print a command's flags: idemctl help <command> (or idemctl <command> --help)\n\nflags:\n")
	return b.String()
}()

// commands are what each command does, for its --help.
var commands = map[string]string{
	"list":       "list records of a namespace (and tenant, state), a page at a time",
	"get":        "show one record, with its token",
	"resolve":    "settle a record whose outcome is unknown: --applied '<Outcome JSON>' or --not-applied",
	"purge":      "erase one record (--key), or a tenant's records (--all-records --yes)",
	"hash-token": "print the token-file entry of a token read from standard input",
	"backup":     "write an online backup of ledgerd's embedded store into its --backup-dir (--name, or backup-<time>)",
}

// run runs idemctl and returns its exit status.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	var g global
	fs := flag.NewFlagSet("idemctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { _, _ = io.WriteString(stderr, usage); fs.PrintDefaults() }
	fs.StringVar(&g.addr, "addr", "127.0.0.1:7070", "ledgerd's gRPC address")
	fs.StringVar(&g.token, "token", "", "an admin principal's bearer token")
	fs.StringVar(&g.tokenFile, "token-file", "", "a file holding the admin principal's bearer token")
	fs.BoolVar(&g.tls, "tls", false, "connect with TLS")
	fs.StringVar(&g.ca, "ca", "", "CA bundle (PEM) that ledgerd's certificate chains to (with --tls; default: the system's)")
	fs.StringVar(&g.cert, "cert", "", "client certificate (PEM), for an admin principal named by its certificate")
	fs.StringVar(&g.key, "key", "", "client certificate's private key (PEM)")
	fs.StringVar(&g.serverName, "server-name", "", "the name ledgerd's certificate must carry (default: from --addr)")
	fs.StringVar(&g.output, "o", "table", "output: table or json")
	fs.DurationVar(&g.timeout, "timeout", 10*time.Second, "bound on each call")
	printVersion := fs.Bool("version", false, "print the version and exit")
	if err := ff.Parse(fs, args, ff.WithEnvVarPrefix("IDEMCTL")); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *printVersion {
		_, _ = fmt.Fprintln(stdout, "idemctl", buildinfo.Read().String())
		return 0
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	if g.output != "table" && g.output != "json" {
		_, _ = fmt.Fprintln(stderr, "idemctl: -o is table or json")
		return 2
	}
	cmd, rest := fs.Arg(0), fs.Args()[1:]
	if cmd == "help" {
		if len(rest) != 1 || commands[rest[0]] == "" {
			fs.SetOutput(stdout)
			_, _ = io.WriteString(stdout, usage)
			fs.PrintDefaults()
			if len(rest) == 0 {
				return 0
			}
			return 2
		}
		cmd, rest = rest[0], []string{"--help"}
	}
	var err error
	switch cmd {
	case "hash-token":
		err = hashToken(rest, stdin, stdout)
	case "list", "get", "resolve", "purge", "backup":
		err = withAdmin(ctx, g, func(ctx context.Context, admin ledgerv1.AdminServiceClient) error {
			out := printer{w: stdout, json: g.output == "json"}
			switch cmd {
			case "list":
				return list(ctx, admin, rest, out)
			case "get":
				return get(ctx, admin, rest, out)
			case "resolve":
				return resolve(ctx, admin, rest, out)
			case "backup":
				return backup(ctx, admin, rest, out)
			}
			return purge(ctx, admin, rest, out)
		})
	default:
		err = usageError{fmt.Errorf("unknown command %q", cmd)}
	}
	var ue usageError
	var help helpError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &help):
		_, _ = fmt.Fprintf(stdout, "usage: idemctl [flags] %s [flags]\n\n%s\n\nflags:\n", cmd, commands[cmd])
		help.fs.SetOutput(stdout)
		help.fs.PrintDefaults()
		_, _ = io.WriteString(stdout, "\nidemctl --help lists the flags before the command (the address, the credentials).\n")
		return 0
	case errors.As(err, &ue):
		_, _ = fmt.Fprintln(stderr, "idemctl:", err)
		return 2
	}
	_, _ = fmt.Fprintln(stderr, "idemctl:", describe(err))
	return 1
}

// describe is an error as a person reads it: the ledger's code and
// message, and what to do about a refusal.
func describe(err error) string {
	if !ledgerstatus.IsTyped(err) {
		return err.Error()
	}
	le := ledgerstatus.FromError(err)
	msg := le.Code.String() + ": " + le.Message
	switch le.Code.String() {
	case "UNAUTHENTICATED":
		msg += " (pass an admin principal's token with --token or IDEMCTL_TOKEN)"
	case "PERMISSION_DENIED":
		msg += " (the token must be an admin entry of ledgerd's token file: sha256:<hex> _admin <name>)"
	}
	if le.Retryable() && le.RetryAfter > 0 {
		msg += fmt.Sprintf(" (retry after %s)", le.RetryAfter)
	}
	return msg
}

// withAdmin dials ledgerd and calls f with an AdminService client whose
// calls carry the token and the timeout.
func withAdmin(ctx context.Context, g global, f func(context.Context, ledgerv1.AdminServiceClient) error) error {
	creds := insecure.NewCredentials()
	if g.tls || g.ca != "" || g.cert != "" {
		tc, err := clienttls.Config(clienttls.Options{CAFile: g.ca, CertFile: g.cert, KeyFile: g.key, ServerName: g.serverName})
		if err != nil {
			return usageError{fmt.Errorf("--ca, --cert, --key: %w", err)}
		}
		creds = credentials.NewTLS(tc)
	}
	token := g.token
	if g.tokenFile != "" {
		b, err := os.ReadFile(g.tokenFile)
		if err != nil {
			return usageError{fmt.Errorf("--token-file: %w", err)}
		}
		token = strings.TrimSpace(string(b))
	}
	conn, err := grpc.NewClient(g.addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return usageError{fmt.Errorf("--addr: %w", err)}
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	return f(ctx, ledgerv1.NewAdminServiceClient(conn))
}
