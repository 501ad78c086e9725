package server

import (
	"context"
	"encoding/base64"
	"log/slog"
	"regexp"
	"strings"
	"time"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
)

// Admin is AdminService over a Ledger: operators list, read, resolve and
// purge the records of any namespace. It answers admin principals only
// (Principal.Admin), and writes an audit line for every call with the
// principal, what was asked and what changed.
type Admin struct {
	ledgerv1.UnimplementedAdminServiceServer
	ledger *ledger.Ledger
	auth   Authenticator
	log    *slog.Logger
	backup func(ctx context.Context, name string) (*ledgerv1.BackupResponse, error)
}

var _ ledgerv1.AdminServiceServer = (*Admin)(nil)

// NewAdmin returns the AdminService of l, authenticating with cfg.Auth and
// auditing to cfg.Logger.
func NewAdmin(l *ledger.Ledger, cfg Config) *Admin {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Admin{ledger: l, auth: cfg.Auth, log: log, backup: cfg.Backup}
}

// admin authenticates an admin principal. who names the caller for the
// audit line, also when it is refused: the admin's name, "namespace:<ns>"
// for a write service's credentials, "unauthenticated" for none.
func (a *Admin) admin(ctx context.Context) (who string, err error) {
	if a.auth == nil {
		return "unauthenticated", errcode.Errorf(errcode.Unauthenticated, "no authenticator is configured")
	}
	p, err := a.auth.Authenticate(ctx)
	if err != nil {
		return "unauthenticated", err
	}
	if p.Admin == "" {
		return "namespace:" + p.Namespace, errcode.Errorf(errcode.PermissionDenied, "AdminService answers admin principals only")
	}
	return p.Admin, nil
}

// audit writes the audit line of an admin call; a read (list, get) says
// read=true, so that an audit page can keep reads apart from changes.
func (a *Admin) audit(ctx context.Context, principal, call string, attrs ...any) {
	a.log.InfoContext(ctx, "audit: "+call, append([]any{"audit", true, "principal", principal}, attrs...)...)
}

// fail encodes an admin call's error as LedgerService's are (the typed
// details and the pushback trailer), and audits the refusal: who asked,
// for what (what: the request's namespace, tenant and key).
func (a *Admin) fail(ctx context.Context, who, call string, err error, what ...any) error {
	le := errcode.As(err)
	a.audit(ctx, who, call+" refused", append([]any{"code", le.Code.String(), "reason", le.Message}, what...)...)
	ledgerstatus.SetPushback(ctx, le)
	return ledgerstatus.Err(le)
}

// ListRecords implements AdminService.
func (a *Admin) ListRecords(ctx context.Context, req *ledgerv1.ListRecordsRequest) (*ledgerv1.ListRecordsResponse, error) {
	what := []any{"namespace", req.GetNamespace(), "tenant", req.GetTenant(), "state", req.GetState().String()}
	who, err := a.admin(ctx)
	if err != nil {
		return nil, a.fail(ctx, who, "list", err, what...)
	}
	lr := ledger.ListRequest{Namespace: req.GetNamespace(), Tenant: req.GetTenant(), PageSize: int(req.GetPageSize())}
	if lr.State, err = stateFromWire(req.GetState()); err == nil && req.GetPageToken() != "" {
		lr.After, err = decodePageToken(req.GetPageToken())
	}
	var res ledger.ListResult
	if err == nil {
		res, err = a.ledger.List(ctx, lr)
	}
	if err != nil {
		return nil, a.fail(ctx, who, "list", err, what...)
	}
	out := &ledgerv1.ListRecordsResponse{Records: make([]*ledgerv1.AdminRecord, 0, len(res.Records))}
	for _, rec := range res.Records {
		ar := adminRecord(rec)
		if !req.GetWithOutcomes() {
			ar.Record.Outcome = nil
		}
		out.Records = append(out.Records, ar)
	}
	if res.More {
		out.NextPageToken = encodePageToken(res.Next)
	}
	a.audit(ctx, who, "list", "read", true, "namespace", lr.Namespace, "tenant", lr.Tenant, "state", req.GetState().String(),
		"records", len(out.GetRecords()), "more", res.More)
	return out, nil
}

// GetRecord implements AdminService.
func (a *Admin) GetRecord(ctx context.Context, req *ledgerv1.GetRecordRequest) (*ledgerv1.GetRecordResponse, error) {
	sc := ledger.Scope{Namespace: req.GetNamespace(), Tenant: req.GetTenant(), Key: req.GetKey()}
	what := []any{"namespace", sc.Namespace, "tenant", sc.Tenant, "key", sc.Key}
	who, err := a.admin(ctx)
	if err != nil {
		return nil, a.fail(ctx, who, "get", err, what...)
	}
	rec, err := a.ledger.Get(ctx, sc)
	if err != nil {
		return nil, a.fail(ctx, who, "get", err, what...)
	}
	a.audit(ctx, who, "get", "read", true, "namespace", sc.Namespace, "tenant", sc.Tenant, "key", sc.Key, "state", rec.State.String())
	return &ledgerv1.GetRecordResponse{Record: adminRecord(rec)}, nil
}

// ResolveRecord implements AdminService.
func (a *Admin) ResolveRecord(ctx context.Context, req *ledgerv1.ResolveRecordRequest) (*ledgerv1.ResolveRecordResponse, error) {
	sc := ledger.Scope{Namespace: req.GetNamespace(), Tenant: req.GetTenant(), Key: req.GetKey()}
	what := []any{"namespace", sc.Namespace, "tenant", sc.Tenant, "key", sc.Key}
	who, err := a.admin(ctx)
	if err != nil {
		return nil, a.fail(ctx, who, "resolve", err, what...)
	}
	var applied *ledger.Outcome
	switch r := req.GetResolution().(type) {
	case *ledgerv1.ResolveRecordRequest_Applied:
		if applied = outcomeFromWire(r.Applied); applied == nil {
			err = errcode.Errorf(errcode.ValidationFailed, "applied needs an outcome")
		}
	case *ledgerv1.ResolveRecordRequest_NotApplied:
	default:
		err = errcode.Errorf(errcode.ValidationFailed, "the resolution is missing: applied (with the outcome) or not_applied")
	}
	var rec ledger.Record
	if err == nil {
		rec, err = a.ledger.Resolve(ctx, sc, applied)
	}
	if err != nil {
		return nil, a.fail(ctx, who, "resolve", err, what...)
	}
	a.audit(ctx, who, "record resolved", "namespace", sc.Namespace, "tenant", sc.Tenant, "key", sc.Key,
		"applied", applied != nil, "attempt", rec.Attempt, "state", rec.State.String())
	res := &ledgerv1.ResolveRecordResponse{}
	if rec.State != ledger.StateAbsent && rec.State != ledger.StateReleased {
		res.Record = adminRecord(rec)
	}
	return res, nil
}

// PurgeKey implements AdminService.
func (a *Admin) PurgeKey(ctx context.Context, req *ledgerv1.PurgeKeyRequest) (*ledgerv1.PurgeKeyResponse, error) {
	sc := ledger.Scope{Namespace: req.GetNamespace(), Tenant: req.GetTenant(), Key: req.GetKey()}
	what := []any{"namespace", sc.Namespace, "tenant", sc.Tenant, "key", sc.Key}
	who, err := a.admin(ctx)
	if err != nil {
		return nil, a.fail(ctx, who, "purge key", err, what...)
	}
	if sc.Key == "" {
		return nil, a.fail(ctx, who, "purge key", errcode.Errorf(errcode.KeyMissing, "key is missing"), what...)
	}
	res, err := a.ledger.Purge(ctx, sc, 0)
	if err != nil {
		return nil, a.fail(ctx, who, "purge key", err, what...)
	}
	a.audit(ctx, who, "key purged", "namespace", sc.Namespace, "tenant", sc.Tenant, "key", sc.Key, "purged", res.Purged)
	return &ledgerv1.PurgeKeyResponse{Purged: res.Purged > 0}, nil
}

// PurgeTenant implements AdminService.
func (a *Admin) PurgeTenant(ctx context.Context, req *ledgerv1.PurgeTenantRequest) (*ledgerv1.PurgeTenantResponse, error) {
	sc := ledger.Scope{Namespace: req.GetNamespace(), Tenant: req.GetTenant()}
	what := []any{"namespace", sc.Namespace, "tenant", sc.Tenant}
	who, err := a.admin(ctx)
	if err != nil {
		return nil, a.fail(ctx, who, "purge tenant", err, what...)
	}
	if sc.Tenant == "" {
		return nil, a.fail(ctx, who, "purge tenant", errcode.Errorf(errcode.ValidationFailed, "tenant is missing"), what...)
	}
	res, err := a.ledger.Purge(ctx, sc, int(req.GetLimit()))
	if err != nil {
		return nil, a.fail(ctx, who, "purge tenant", err, what...)
	}
	a.audit(ctx, who, "tenant purged", "namespace", sc.Namespace, "tenant", sc.Tenant,
		"purged", res.Purged, "skipped", res.Skipped, "more", res.More)
	return &ledgerv1.PurgeTenantResponse{Purged: int64(res.Purged), Skipped: int64(res.Skipped), More: res.More}, nil
}

// backupName is a backup's name: a directory under --backup-dir.
var backupName = regexp.MustCompile(`^[a-z0-9-][a-z0-9.-]{0,63}$`)

// Backup implements AdminService.
func (a *Admin) Backup(ctx context.Context, req *ledgerv1.BackupRequest) (*ledgerv1.BackupResponse, error) {
	name := req.GetName()
	who, err := a.admin(ctx)
	if err != nil {
		return nil, a.fail(ctx, who, "backup", err, "name", name)
	}
	if name == "" {
		name = "backup-" + time.Now().UTC().Format("20060102T150405Z")
	}
	switch {
	case !backupName.MatchString(name):
		err = errcode.Errorf(errcode.ValidationFailed, "the backup's name %q is not 1 to 64 of a-z, 0-9, '-' and '.', starting with no '.'", name)
	case a.backup == nil:
		err = errcode.Errorf(errcode.ValidationFailed, "this ledgerd takes no backup: its store is SQL (back up the database), or it runs without --backup-dir")
	}
	if err != nil {
		return nil, a.fail(ctx, who, "backup", err, "name", name)
	}
	res, err := a.backup(ctx, name)
	if err != nil {
		return nil, a.fail(ctx, who, "backup", err, "name", name)
	}
	a.audit(ctx, who, "backup taken", "name", name, "path", res.GetPath(), "bytes", res.GetBytes(), "sequence", res.GetSequence())
	return res, nil
}

// adminRecord is a record with its scope and token.
func adminRecord(rec ledger.Record) *ledgerv1.AdminRecord {
	return &ledgerv1.AdminRecord{
		Namespace: rec.Scope.Namespace, Tenant: rec.Scope.Tenant, Key: rec.Scope.Key,
		Token: rec.Token, Record: recordToWire(rec),
	}
}

func stateFromWire(s ledgerv1.State) (ledger.State, error) {
	switch s {
	case ledgerv1.State_STATE_UNSPECIFIED:
		return ledger.StateAbsent, nil
	case ledgerv1.State_STATE_IN_PROGRESS:
		return ledger.StateInProgress, nil
	case ledgerv1.State_STATE_COMPLETED:
		return ledger.StateCompleted, nil
	case ledgerv1.State_STATE_OUTCOME_UNKNOWN:
		return ledger.StateUnknown, nil
	case ledgerv1.State_STATE_EXPIRED:
		return ledger.StateExpired, nil
	}
	return 0, errcode.Errorf(errcode.ValidationFailed, "unknown state %d", s)
}

// A page token is where a listing resumes: the scope of the last row
// read, NUL-separated (scopes are printable ASCII), in unpadded
// URL-safe base64.
func encodePageToken(s ledger.Scope) string {
	return base64.RawURLEncoding.EncodeToString([]byte(s.Namespace + "\x00" + s.Tenant + "\x00" + s.Key))
}

func decodePageToken(tok string) (ledger.Scope, error) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	parts := strings.Split(string(b), "\x00")
	if err != nil || len(parts) != 3 {
		return ledger.Scope{}, errcode.Errorf(errcode.ValidationFailed, "the page token is not one of this server's")
	}
	sc := ledger.Scope{Namespace: parts[0], Tenant: parts[1], Key: parts[2]}
	if err := ledger.ValidateScope(sc, ledger.MaxKeyBytes); err != nil {
		return ledger.Scope{}, errcode.Errorf(errcode.ValidationFailed, "the page token is not one of this server's: %v", err)
	}
	return sc, nil
}
