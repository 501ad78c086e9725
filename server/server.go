// Package server implements idemledger.v1.LedgerService over a
// ledger.Ledger: it validates every field of every request, takes the
// namespace from the caller's credentials (never from the request), checks
// that the caller may act for the tenant, and returns every error as a
// status with the typed details of package ledgerstatus and the
// grpc-retry-pushback-ms trailer.
package server

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
)

// Principal is an authenticated caller: the namespace its records live in
// and the tenants it may act for, or an operator of AdminService.
type Principal struct {
	Namespace string
	// Tenants lists the tenants the principal may act for; "*" means any.
	Tenants []string
	// Admin, when set, names an admin principal: it may call AdminService.
	// An entry of a credential file is one or the other: a write service
	// (a namespace) or an admin (namespace field AdminNamespace).
	Admin string
}

// May reports whether the principal may act for tenant.
func (p Principal) May(tenant string) bool {
	return slices.Contains(p.Tenants, "*") || slices.Contains(p.Tenants, tenant)
}

// Authenticator finds the principal of a call, or fails with
// UNAUTHENTICATED.
type Authenticator interface {
	Authenticate(ctx context.Context) (Principal, error)
}

// AuthenticatorFunc adapts a function to Authenticator.
type AuthenticatorFunc func(ctx context.Context) (Principal, error)

// Authenticate calls f.
func (f AuthenticatorFunc) Authenticate(ctx context.Context) (Principal, error) { return f(ctx) }

// Config configures a Server.
type Config struct {
	// Auth finds the caller; required.
	Auth Authenticator
	// Logger hears of INTERNAL and UNAVAILABLE errors, with their causes;
	// nil discards.
	Logger *slog.Logger
	// RateLimit, when not nil, limits the calls of each namespace; calls
	// over it are RATE_LIMITED before they reach the ledger.
	RateLimit *RateLimit
	// Observe, when not nil, hears every decision, with the namespace it
	// was made for: the hook for metrics (ledgerd binds Prometheus to it).
	// It is called on the call's goroutine and must be safe for concurrent
	// use.
	Observe func(namespace string, d Decision)
	// CallInterceptor, when not nil, runs around each call on a Stream
	// (Lookups with a wait aside, which hold no goroutine) as the gRPC
	// server's unary interceptors run around a unary call, under the
	// unary method's full name: ledgerd counts the calls there, so that
	// the metrics of a Begin are the same whichever way it came.
	CallInterceptor grpc.UnaryServerInterceptor
	// StreamMaxAge, when positive, drains every Stream that old, so that
	// clients move to new streams (and, after a GOAWAY, to new connections
	// and replicas) without a call failing.
	StreamMaxAge time.Duration
	// Backup, when not nil, writes an online backup of the store named
	// name (AdminService.Backup has checked it) and says where it is:
	// ledgerd binds it to its embedded store and --backup-dir.
	Backup func(ctx context.Context, name string) (*ledgerv1.BackupResponse, error)
}

// Server is the LedgerService. It is safe for concurrent use.
type Server struct {
	ledgerv1.UnimplementedLedgerServiceServer
	ledger     *ledger.Ledger
	auth       Authenticator
	log        *slog.Logger
	limit      *RateLimit
	onDecision func(namespace string, d Decision)

	streamMaxAge time.Duration
	intercept    grpc.UnaryServerInterceptor // Config.CallInterceptor
	drain        chan struct{}               // closed by Drain
	drainOnce    sync.Once
}

var _ ledgerv1.LedgerServiceServer = (*Server)(nil)

// New returns a Server over l.
func New(l *ledger.Ledger, cfg Config) *Server {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{ledger: l, auth: cfg.Auth, log: log, limit: cfg.RateLimit, onDecision: cfg.Observe,
		streamMaxAge: cfg.StreamMaxAge, intercept: cfg.CallInterceptor, drain: make(chan struct{})}
}

// Drain sends every Stream, open now or later, a drain notice: its client
// moves its new calls to a new stream, on another connection once the
// server has sent GOAWAY. It also answers every Lookup waiting now, and
// every later one that would wait, at once (UNAVAILABLE, retryable after
// a second; ledger.Ledger.EndWaits), so that the drain does not hold
// them to its timeout. Call it before grpc.Server.GracefulStop, which
// waits for streams to end. Other unary calls are not affected.
func (s *Server) Drain() {
	s.drainOnce.Do(func() { close(s.drain) })
	s.ledger.EndWaits()
}

// scope authenticates the call and builds the scope of (tenant, key):
// UNAUTHENTICATED without a principal, KEY_INVALID or VALIDATION_FAILED
// for a request Codec let through with a field that is not UTF-8,
// PERMISSION_DENIED for a tenant the principal may not act for.
func (s *Server) scope(ctx context.Context, req proto.Message, tenant, key string) (ledger.Scope, error) {
	bad := takeBadUTF8(req)
	p, err := s.principal(ctx)
	if err != nil {
		return ledger.Scope{}, err
	}
	if bad != nil {
		return ledger.Scope{}, bad
	}
	if tenant == "" {
		return ledger.Scope{}, errcode.Errorf(errcode.ValidationFailed, "tenant is missing")
	}
	if !p.May(tenant) {
		return ledger.Scope{}, errcode.Errorf(errcode.PermissionDenied, "the caller may not act for this tenant")
	}
	if s.limit != nil {
		if err := s.limit.Allow(p.Namespace); err != nil {
			s.observe(p.Namespace, DecisionRateLimited)
			return ledger.Scope{}, err
		}
	}
	return ledger.Scope{Namespace: p.Namespace, Tenant: tenant, Key: key}, nil
}

// principal authenticates the call.
func (s *Server) principal(ctx context.Context) (Principal, error) {
	if s.auth == nil {
		return Principal{}, errcode.Errorf(errcode.Unauthenticated, "no authenticator is configured")
	}
	p, err := s.auth.Authenticate(ctx)
	if err != nil {
		return Principal{}, err
	}
	if p.Namespace == "" {
		if p.Admin != "" {
			return Principal{}, errcode.Errorf(errcode.PermissionDenied, "admin credentials do not write: call LedgerService with a write service's")
		}
		return Principal{}, errcode.Errorf(errcode.Unauthenticated, "the caller has no namespace")
	}
	return p, nil
}

func (s *Server) observe(namespace string, d Decision) {
	if s.onDecision != nil {
		s.onDecision(namespace, d)
	}
}

// errorDecisions are the errors that are decisions of the ledger rather
// than failures.
var errorDecisions = map[errcode.Code]Decision{
	errcode.InProgress:     DecisionInProgress,
	errcode.KeyReused:      DecisionKeyReused,
	errcode.RetryTooLate:   DecisionTooLate,
	errcode.LeaseLost:      DecisionLeaseLost,
	errcode.OutcomeUnknown: DecisionUnknown,
	errcode.KeyExpired:     DecisionExpired,
}

// fail counts the decision err stands for, encodes err for the wire and
// sets the pushback trailer. sc is the call's scope, zero when the call
// failed before it had one.
//
// A failure is logged once: a unary call by the server's logging
// interceptor, which finds the cause callers must not see with Cause; a
// call on a Stream, which that interceptor logs only as a whole, here, when
// it is INTERNAL or UNAVAILABLE.
func (s *Server) fail(ctx context.Context, method string, sc ledger.Scope, err error) error {
	le := errcode.As(err)
	if d, ok := errorDecisions[le.Code]; ok && sc.Namespace != "" {
		s.observe(sc.Namespace, d)
	}
	if _, onStream := grpc.ServerTransportStreamFromContext(ctx).(noTrailers); onStream && (le.Code == errcode.Internal || le.Code == errcode.Unavailable) {
		s.log.ErrorContext(ctx, "ledger call failed", "grpc.method", method, "code", le.Code.String(), "error", err)
	}
	ledgerstatus.SetPushback(ctx, le)
	return causedError{status: ledgerstatus.Encode(le), cause: le.Err}
}

// causedError is the status a call fails with, which is all gRPC sends,
// and its cause, which stays in the process for the log (Cause).
type causedError struct {
	status *status.Status
	cause  error
}

func (e causedError) Error() string              { return e.status.Err().Error() }
func (e causedError) GRPCStatus() *status.Status { return e.status }
func (e causedError) Unwrap() error              { return e.cause }

// Cause returns the cause of a call's error that callers are not told (a
// database's or a disk's error), or nil: for the server's logging
// interceptor (go-grpc-middleware's logging.WithErrorFields).
func Cause(err error) error {
	var ce causedError
	if errors.As(err, &ce) {
		return ce.cause
	}
	return nil
}

// Begin implements LedgerService.Begin.
func (s *Server) Begin(ctx context.Context, req *ledgerv1.BeginRequest) (*ledgerv1.BeginResponse, error) {
	sc, err := s.scope(ctx, req, req.GetTenant(), req.GetKey())
	if err != nil {
		return nil, s.fail(ctx, "Begin", sc, err)
	}
	res, err := s.begin(ctx, sc, req)
	if err != nil {
		return nil, s.fail(ctx, "Begin", sc, err)
	}
	return res, nil
}

func (s *Server) begin(ctx context.Context, sc ledger.Scope, req *ledgerv1.BeginRequest) (*ledgerv1.BeginResponse, error) {
	lease, err := optionalDuration("lease", req.GetLease())
	if err != nil {
		return nil, err
	}
	retention, err := optionalDuration("retention", req.GetRetention())
	if err != nil {
		return nil, err
	}
	var first time.Time
	if req.GetFirstAttemptAt() != nil {
		if err := req.GetFirstAttemptAt().CheckValid(); err != nil {
			return nil, errcode.Errorf(errcode.ValidationFailed, "first_attempt_at is not a valid timestamp")
		}
		first = req.GetFirstAttemptAt().AsTime()
	}
	breq := ledger.BeginRequest{
		Scope: sc, Fingerprint: req.GetFingerprint(), Method: req.GetMethod(),
		Lease: lease, Retention: retention, FirstAttemptAt: first, KeySource: req.GetKeySource(),
	}
	switch req.GetOnLeaseExpiry() {
	case ledgerv1.OnLeaseExpiry_ON_LEASE_EXPIRY_UNSPECIFIED, ledgerv1.OnLeaseExpiry_ON_LEASE_EXPIRY_TAKEOVER:
	case ledgerv1.OnLeaseExpiry_ON_LEASE_EXPIRY_HOLD:
		breq.OnLeaseExpiry = ledger.Hold
	default:
		return nil, errcode.Errorf(errcode.ValidationFailed, "on_lease_expiry %d is not a known policy", req.GetOnLeaseExpiry())
	}
	if t := req.GetTombstoneRetention(); t != nil {
		if t.CheckValid() != nil || t.AsDuration() < 0 {
			return nil, errcode.Errorf(errcode.ValidationFailed, "tombstone_retention must be zero or a positive duration")
		}
		d := t.AsDuration()
		breq.TombstoneRetention = &d
	}
	res, err := s.ledger.Begin(ctx, breq)
	if err != nil {
		return nil, err
	}
	if c := res.Claim; c != nil {
		if c.Attempt > 1 {
			s.observe(sc.Namespace, DecisionTakenOver)
		} else {
			s.observe(sc.Namespace, DecisionClaimed)
		}
		return &ledgerv1.BeginResponse{Result: &ledgerv1.BeginResponse_Claim{Claim: &ledgerv1.Claim{
			Token: c.Token, Attempt: c.Attempt, LeaseExpiresAt: timestamppb.New(c.LeaseExpiresAt),
			Namespace: sc.Namespace, CreatedAt: timestamppb.New(c.CreatedAt), ExpiresAt: timestamppb.New(c.ExpiresAt),
		}}}, nil
	}
	s.observe(sc.Namespace, DecisionReplayed)
	return &ledgerv1.BeginResponse{Result: &ledgerv1.BeginResponse_Replay{Replay: &ledgerv1.Replay{
		Outcome: outcomeToWire(res.Replay.Outcome), CompletedAt: timestamppb.New(res.Replay.CompletedAt), Attempt: res.Replay.Attempt,
	}}}, nil
}

// Complete implements LedgerService.Complete.
func (s *Server) Complete(ctx context.Context, req *ledgerv1.CompleteRequest) (*ledgerv1.CompleteResponse, error) {
	sc, err := s.scope(ctx, req, req.GetTenant(), req.GetKey())
	if err != nil {
		return nil, s.fail(ctx, "Complete", sc, err)
	}
	rec, err := s.ledger.Complete(ctx, sc, req.GetToken(), outcomeFromWire(req.GetOutcome()))
	if err != nil {
		return nil, s.fail(ctx, "Complete", sc, err)
	}
	s.observe(sc.Namespace, DecisionCompleted)
	return &ledgerv1.CompleteResponse{CompletedAt: timestamppb.New(rec.CompletedAt), ExpiresAt: timestamppb.New(rec.ExpiresAt)}, nil
}

// Release implements LedgerService.Release.
func (s *Server) Release(ctx context.Context, req *ledgerv1.ReleaseRequest) (*ledgerv1.ReleaseResponse, error) {
	sc, err := s.scope(ctx, req, req.GetTenant(), req.GetKey())
	if err != nil {
		return nil, s.fail(ctx, "Release", sc, err)
	}
	if err := s.ledger.Release(ctx, sc, req.GetToken()); err != nil {
		return nil, s.fail(ctx, "Release", sc, err)
	}
	s.observe(sc.Namespace, DecisionReleased)
	return &ledgerv1.ReleaseResponse{}, nil
}

// Extend implements LedgerService.Extend.
func (s *Server) Extend(ctx context.Context, req *ledgerv1.ExtendRequest) (*ledgerv1.ExtendResponse, error) {
	sc, err := s.scope(ctx, req, req.GetTenant(), req.GetKey())
	if err != nil {
		return nil, s.fail(ctx, "Extend", sc, err)
	}
	lease, err := optionalDuration("lease", req.GetLease())
	if err != nil {
		return nil, s.fail(ctx, "Extend", sc, err)
	}
	rec, err := s.ledger.Extend(ctx, sc, req.GetToken(), lease)
	if err != nil {
		return nil, s.fail(ctx, "Extend", sc, err)
	}
	s.observe(sc.Namespace, DecisionExtended)
	return &ledgerv1.ExtendResponse{LeaseExpiresAt: timestamppb.New(rec.LeaseExpiresAt)}, nil
}

// Lookup implements LedgerService.Lookup.
func (s *Server) Lookup(ctx context.Context, req *ledgerv1.LookupRequest) (*ledgerv1.LookupResponse, error) {
	type answer struct {
		res *ledgerv1.LookupResponse
		err error
	}
	ch := make(chan answer, 1)
	s.lookup(ctx, req, func(res *ledgerv1.LookupResponse, err error) { ch <- answer{res, err} })
	a := <-ch
	return a.res, a.err
}

// lookup is Lookup that does not hold its caller while it waits (see
// ledger.LookupFunc): a Stream runs its waiting Lookups this way, so that
// they cost no goroutine each. It calls done once.
func (s *Server) lookup(ctx context.Context, req *ledgerv1.LookupRequest, done func(*ledgerv1.LookupResponse, error)) {
	sc, err := s.scope(ctx, req, req.GetTenant(), req.GetKey())
	var wait time.Duration
	if err == nil {
		wait, err = optionalDuration("wait", req.GetWait())
	}
	if err != nil {
		done(nil, s.fail(ctx, "Lookup", sc, err))
		return
	}
	s.ledger.LookupFunc(ctx, sc, wait, func(rec ledger.Record, err error) {
		if err != nil {
			done(nil, s.fail(ctx, "Lookup", sc, err))
			return
		}
		done(&ledgerv1.LookupResponse{Record: recordToWire(rec)}, nil)
	})
}

// Resolve implements LedgerService.Resolve. Every resolution is written to
// the log, with the principal that made it: an audit line.
func (s *Server) Resolve(ctx context.Context, req *ledgerv1.ResolveRequest) (*ledgerv1.ResolveResponse, error) {
	sc, err := s.scope(ctx, req, req.GetTenant(), req.GetKey())
	var applied *ledger.Outcome
	if err == nil {
		switch r := req.GetResolution().(type) {
		case *ledgerv1.ResolveRequest_Applied:
			if applied = outcomeFromWire(r.Applied); applied == nil {
				err = errcode.Errorf(errcode.ValidationFailed, "applied needs an outcome")
			}
		case *ledgerv1.ResolveRequest_NotApplied:
		default:
			err = errcode.Errorf(errcode.ValidationFailed, "the resolution is missing: applied (with the outcome) or not_applied")
		}
	}
	if err == nil {
		var rec ledger.Record
		if rec, err = s.ledger.Resolve(ctx, sc, applied); err == nil {
			s.observe(sc.Namespace, DecisionResolved)
			s.log.InfoContext(ctx, "audit: record resolved", "audit", true, "principal", sc.Namespace,
				"tenant", sc.Tenant, "key", sc.Key, "applied", applied != nil, "attempt", rec.Attempt)
			res := &ledgerv1.ResolveResponse{}
			if rec.State != ledger.StateAbsent && rec.State != ledger.StateReleased {
				res.Record = recordToWire(rec)
			}
			return res, nil
		}
	}
	return nil, s.fail(ctx, "Resolve", sc, err)
}

// optionalDuration reads a duration field: unset is 0 (the default); a set
// duration must be valid and positive.
func optionalDuration(name string, d *durationpb.Duration) (time.Duration, error) {
	if d == nil {
		return 0, nil
	}
	if d.CheckValid() != nil || d.AsDuration() <= 0 {
		return 0, errcode.Errorf(errcode.ValidationFailed, "%s must be a positive duration", name)
	}
	return d.AsDuration(), nil
}

func outcomeFromWire(o *ledgerv1.Outcome) *ledger.Outcome {
	switch r := o.GetResult().(type) {
	case *ledgerv1.Outcome_Response:
		return &ledger.Outcome{Response: r.Response}
	case *ledgerv1.Outcome_Status:
		return &ledger.Outcome{Status: ledgerstatus.FromFields(r.Status).Proto()}
	}
	return nil
}

func outcomeToWire(o *ledger.Outcome) *ledgerv1.Outcome {
	switch {
	case o == nil:
		return nil
	case o.Response != nil:
		return &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: o.Response}}
	}
	return &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Status{Status: ledgerstatus.ToStored(status.FromProto(o.Status))}}
}

// recordToWire is the view of a record as a read returns it (Record.AsOf).
func recordToWire(r ledger.Record) *ledgerv1.Record {
	v := &ledgerv1.Record{
		Method: r.Method, Fingerprint: r.Fingerprint, Attempt: r.Attempt,
		CreatedAt: timestamppb.New(r.CreatedAt), ExpiresAt: timestamppb.New(r.ExpiresAt),
		OnLeaseExpiry: ledgerv1.OnLeaseExpiry_ON_LEASE_EXPIRY_TAKEOVER, KeySource: r.KeySource,
	}
	if r.OnLeaseExpiry == ledger.Hold {
		v.OnLeaseExpiry = ledgerv1.OnLeaseExpiry_ON_LEASE_EXPIRY_HOLD
	}
	if !r.ForgetAt.IsZero() {
		v.ForgetAt = timestamppb.New(r.ForgetAt)
	}
	switch r.State {
	case ledger.StateInProgress:
		v.State = ledgerv1.State_STATE_IN_PROGRESS
		v.LeaseExpiresAt = timestamppb.New(r.LeaseExpiresAt)
	case ledger.StateUnknown:
		v.State = ledgerv1.State_STATE_OUTCOME_UNKNOWN
		v.LeaseExpiresAt = timestamppb.New(r.LeaseExpiresAt)
	case ledger.StateCompleted:
		v.State = ledgerv1.State_STATE_COMPLETED
		v.CompletedAt = timestamppb.New(r.CompletedAt)
		v.Outcome = outcomeToWire(r.Outcome)
	case ledger.StateExpired:
		v.State = ledgerv1.State_STATE_EXPIRED
		v.CompletedAt = timestamppb.New(r.CompletedAt)
	}
	return v
}
