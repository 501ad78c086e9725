package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	// The well-known types, so that --applied may name any of them.
	_ "google.golang.org/protobuf/types/known/emptypb"
	_ "google.golang.org/protobuf/types/known/structpb"
	_ "google.golang.org/protobuf/types/known/wrapperspb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/internal/recordstate"
	"github.com/idemledger/idemledger/server"
)

// scope are the flags that name records.
type scope struct{ namespace, tenant, key string }

func scopeFlags(fs *flag.FlagSet, withKey bool) *scope {
	s := &scope{}
	fs.StringVar(&s.namespace, "namespace", "", "the write service's namespace (required)")
	fs.StringVar(&s.tenant, "tenant", "", "the tenant")
	if withKey {
		fs.StringVar(&s.key, "key", "", "the idempotency key")
	}
	return s
}

// helpError is a command's -h or --help: run prints the command's usage
// to standard output and exits 0.
type helpError struct{ fs *flag.FlagSet }

func (helpError) Error() string { return "help requested" }

func parse(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return helpError{fs}
	} else if err != nil {
		return usageError{fmt.Errorf("%s: %w", fs.Name(), err)}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("%s: unexpected arguments %q", fs.Name(), fs.Args())}
	}
	return nil
}

func (s *scope) need(cmd string, tenant, key bool) error {
	switch {
	case s.namespace == "":
		return usageError{fmt.Errorf("%s needs --namespace", cmd)}
	case tenant && s.tenant == "":
		return usageError{fmt.Errorf("%s needs --tenant", cmd)}
	case key && s.key == "":
		return usageError{fmt.Errorf("%s needs --key", cmd)}
	}
	return nil
}

func list(ctx context.Context, admin ledgerv1.AdminServiceClient, args []string, out printer) error {
	fs := flag.NewFlagSet("list", flag.ContinueOnError)
	sc := scopeFlags(fs, false)
	state := fs.String("state", "", "only records in this state: "+strings.Join(recordstate.Names, ", "))
	pageSize := fs.Int("page-size", 100, "records a page, 1 to 1000")
	pageToken := fs.String("page-token", "", "continue a listing where the page before ended")
	all := fs.Bool("all", false, "follow every page")
	outcomes := fs.Bool("with-outcomes", false, "include the stored outcomes")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := sc.need("list", false, false); err != nil {
		return err
	}
	st, keep, ok := recordstate.Filter(*state)
	if !ok {
		return usageError{fmt.Errorf("list: --state is one of %s, not %q", strings.Join(recordstate.Names, ", "), *state)}
	}
	req := &ledgerv1.ListRecordsRequest{Namespace: sc.namespace, Tenant: sc.tenant, State: st,
		PageSize: int32(*pageSize), PageToken: *pageToken, WithOutcomes: *outcomes} //nolint:gosec // the server bounds it
	everything := &ledgerv1.ListRecordsResponse{}
	for {
		res, err := admin.ListRecords(ctx, req)
		if err != nil {
			return err
		}
		now := time.Now()
		for _, r := range res.GetRecords() {
			if keep(r.GetRecord(), now) {
				everything.Records = append(everything.Records, r)
			}
		}
		everything.NextPageToken = res.GetNextPageToken()
		if !*all || res.GetNextPageToken() == "" {
			break
		}
		req.PageToken = res.GetNextPageToken()
	}
	if out.json {
		return out.message(everything)
	}
	out.records(everything.GetRecords())
	if everything.GetNextPageToken() != "" {
		_, _ = fmt.Fprintf(out.w, "more: --page-token %s (or --all)\n", everything.GetNextPageToken())
	}
	return nil
}

func get(ctx context.Context, admin ledgerv1.AdminServiceClient, args []string, out printer) error {
	fs := flag.NewFlagSet("get", flag.ContinueOnError)
	sc := scopeFlags(fs, true)
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := sc.need("get", true, true); err != nil {
		return err
	}
	res, err := admin.GetRecord(ctx, &ledgerv1.GetRecordRequest{Namespace: sc.namespace, Tenant: sc.tenant, Key: sc.key})
	if err != nil {
		return err
	}
	return out.record(res.GetRecord())
}

func resolve(ctx context.Context, admin ledgerv1.AdminServiceClient, args []string, out printer) error {
	fs := flag.NewFlagSet("resolve", flag.ContinueOnError)
	sc := scopeFlags(fs, true)
	notApplied := fs.Bool("not-applied", false, "the write did not happen: the next Begin runs it")
	applied := fs.String("applied", "", "the write happened, with this outcome (idemledger.v1.Outcome as JSON)")
	appliedFile := fs.String("applied-file", "", "as --applied, from a file")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := sc.need("resolve", true, true); err != nil {
		return err
	}
	if *appliedFile != "" {
		b, err := os.ReadFile(*appliedFile)
		if err != nil {
			return usageError{fmt.Errorf("resolve: --applied-file: %w", err)}
		}
		*applied = string(b)
	}
	if *notApplied == (*applied != "") {
		return usageError{errors.New("resolve needs one of --not-applied and --applied")}
	}
	req := &ledgerv1.ResolveRecordRequest{Namespace: sc.namespace, Tenant: sc.tenant, Key: sc.key,
		Resolution: &ledgerv1.ResolveRecordRequest_NotApplied{NotApplied: &ledgerv1.NotApplied{}}}
	if *applied != "" {
		var o ledgerv1.Outcome
		if err := protojson.Unmarshal([]byte(*applied), &o); err != nil {
			return usageError{fmt.Errorf("resolve: --applied is not an Outcome in JSON, such as "+
				`{"response":{"@type":"type.googleapis.com/google.protobuf.StringValue","value":"inv_42"}}: %w`, err)}
		}
		req.Resolution = &ledgerv1.ResolveRecordRequest_Applied{Applied: &o}
	}
	res, err := admin.ResolveRecord(ctx, req)
	if err != nil {
		return err
	}
	if res.GetRecord() == nil {
		if out.json {
			return out.message(res)
		}
		_, _ = fmt.Fprintln(out.w, "resolved as not applied: the key is free, and the next Begin runs the write")
		return nil
	}
	return out.record(res.GetRecord())
}

func purge(ctx context.Context, admin ledgerv1.AdminServiceClient, args []string, out printer) error {
	fs := flag.NewFlagSet("purge", flag.ContinueOnError)
	sc := scopeFlags(fs, true)
	allRecords := fs.Bool("all-records", false, "erase every record of the tenant (an erasure request)")
	yes := fs.Bool("yes", false, "confirm --all-records")
	limit := fs.Int("limit", 1000, "records erased a call, 1 to 10000")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := sc.need("purge", true, false); err != nil {
		return err
	}
	if sc.key != "" {
		if *allRecords {
			return usageError{errors.New("purge takes --key or --all-records, not both")}
		}
		res, err := admin.PurgeKey(ctx, &ledgerv1.PurgeKeyRequest{Namespace: sc.namespace, Tenant: sc.tenant, Key: sc.key})
		if err != nil {
			return err
		}
		if out.json {
			return out.message(res)
		}
		_, _ = fmt.Fprintf(out.w, "purged: %v\n", res.GetPurged())
		return nil
	}
	if !*allRecords || !*yes {
		return usageError{errors.New("purge needs --key, or --all-records --yes to erase every record of the tenant")}
	}
	total := &ledgerv1.PurgeTenantResponse{}
	for {
		res, err := admin.PurgeTenant(ctx, &ledgerv1.PurgeTenantRequest{Namespace: sc.namespace, Tenant: sc.tenant, Limit: int32(*limit)}) //nolint:gosec // the server bounds it
		if err != nil {
			return err
		}
		total.Purged += res.GetPurged()
		total.Skipped = res.GetSkipped()
		if !res.GetMore() {
			break
		}
	}
	if out.json {
		return out.message(total)
	}
	_, _ = fmt.Fprintf(out.w, "purged %d records; %d left because an attempt holds them or their outcome is unknown\n", total.GetPurged(), total.GetSkipped())
	return nil
}

// hashToken prints the token-file entry of a token read from standard
// input (never from the command line, which a shell keeps).
func hashToken(args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("hash-token", flag.ContinueOnError)
	namespace := fs.String("namespace", "", "print a write service's whole entry: its namespace")
	tenants := fs.String("tenants", "", "and its tenants, comma-separated (* for any)")
	admin := fs.String("admin", "", "print an admin principal's whole entry, with this name")
	if err := parse(fs, args); err != nil {
		return err
	}
	line, err := bufio.NewReader(stdin).ReadString('\n')
	token := strings.TrimSpace(line)
	if token == "" {
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		return usageError{errors.New("hash-token reads the token from standard input: echo -n \"$TOKEN\" | idemctl hash-token")}
	}
	entry := server.HashToken(token)
	switch {
	case *admin != "" && *namespace == "":
		entry += " " + server.AdminNamespace + " " + *admin
	case *namespace != "" && *tenants != "" && *admin == "":
		entry += " " + *namespace + " " + *tenants
	case *namespace != "" || *tenants != "" || *admin != "":
		return usageError{errors.New("hash-token takes --namespace with --tenants, or --admin")}
	}
	_, err = fmt.Fprintln(stdout, entry)
	return err
}

// printer writes what idemctl found: tables for people, JSON for scripts.
type printer struct {
	w    io.Writer
	json bool
}

// message writes m as JSON: protojson, with each record's state named as
// recordstate names it (lease_expired included), as the table does.
func (p printer) message(m proto.Message) error {
	b, err := protojson.Marshal(m)
	if err != nil {
		return err
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		return err
	}
	now := time.Now()
	name := func(v any, r *ledgerv1.AdminRecord) {
		if rec, ok := v.(map[string]any)["record"].(map[string]any); ok {
			rec["state"] = recordstate.Of(r.GetRecord(), now)
		}
	}
	switch m := m.(type) {
	case *ledgerv1.AdminRecord:
		name(doc, m)
	case *ledgerv1.ListRecordsResponse:
		if list, ok := doc["records"].([]any); ok {
			for i, r := range m.GetRecords() {
				name(list[i], r)
			}
		}
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(p.w, string(out))
	return err
}

func (p printer) records(recs []*ledgerv1.AdminRecord) {
	tw := tabwriter.NewWriter(p.w, 2, 4, 2, ' ', 0)
	_, _ = fmt.Fprintln(tw, "NAMESPACE\tTENANT\tKEY\tSTATE\tTOKEN\tATTEMPT\tMETHOD\tCREATED\tEXPIRES")
	for _, r := range recs {
		rec := r.GetRecord()
		_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", r.GetNamespace(), r.GetTenant(), r.GetKey(),
			recordstate.Of(rec, time.Now()), r.GetToken(), rec.GetAttempt(), rec.GetMethod(),
			stamp(rec.GetCreatedAt().AsTime()), stamp(rec.GetExpiresAt().AsTime()))
	}
	_ = tw.Flush()
}

func (p printer) record(r *ledgerv1.AdminRecord) error {
	if p.json {
		return p.message(r)
	}
	rec := r.GetRecord()
	tw := tabwriter.NewWriter(p.w, 2, 4, 2, ' ', 0)
	row := func(k, v string) {
		if v != "" {
			_, _ = fmt.Fprintf(tw, "%s\t%s\n", k, v)
		}
	}
	row("namespace", r.GetNamespace())
	row("tenant", r.GetTenant())
	row("key", r.GetKey())
	row("state", recordstate.Of(rec, time.Now()))
	row("token", fmt.Sprint(r.GetToken()))
	row("attempt", fmt.Sprint(rec.GetAttempt()))
	row("method", rec.GetMethod())
	row("fingerprint", rec.GetFingerprint())
	row("key from", rec.GetKeySource())
	row("policy", strings.TrimPrefix(rec.GetOnLeaseExpiry().String(), "ON_LEASE_EXPIRY_"))
	if rec.GetCreatedAt() != nil {
		row("created", stamp(rec.GetCreatedAt().AsTime()))
	}
	if rec.GetLeaseExpiresAt() != nil {
		row("lease ends", stamp(rec.GetLeaseExpiresAt().AsTime()))
	}
	if rec.GetCompletedAt() != nil {
		row("completed", stamp(rec.GetCompletedAt().AsTime()))
	}
	if rec.GetExpiresAt() != nil {
		row("expires", stamp(rec.GetExpiresAt().AsTime()))
	}
	if rec.GetForgetAt() != nil {
		row("forgotten", stamp(rec.GetForgetAt().AsTime()))
	}
	if o := rec.GetOutcome(); o != nil {
		b, _ := protojson.Marshal(o)
		row("outcome", string(b))
	}
	return tw.Flush()
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// backup asks ledgerd for an online backup of its embedded store.
func backup(ctx context.Context, admin ledgerv1.AdminServiceClient, args []string, out printer) error {
	fs := flag.NewFlagSet("backup", flag.ContinueOnError)
	name := fs.String("name", "", "the backup's directory under ledgerd's --backup-dir (default: backup-<UTC time>)")
	if err := parse(fs, args); err != nil {
		return err
	}
	res, err := admin.Backup(ctx, &ledgerv1.BackupRequest{Name: *name})
	if err != nil {
		return err
	}
	if out.json {
		return out.message(res)
	}
	_, err = fmt.Fprintf(out.w, "backup: %s (%d bytes, sequence %d)\n", res.GetPath(), res.GetBytes(), res.GetSequence())
	return err
}
