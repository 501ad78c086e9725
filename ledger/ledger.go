package ledger

import (
	"context"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idemledger/idemledger/ledger/errcode"
)

// Defaults and maxima of Config (docs/contract.md, "Defaults").
const (
	DefaultLease           = 30 * time.Second
	DefaultMaxLease        = time.Hour
	DefaultRetention       = 24 * time.Hour
	DefaultMaxRetention    = 7 * 24 * time.Hour
	DefaultMaxOutcomeBytes = 1 << 20
	DefaultMaxRetryAfter   = 2 * time.Second
	DefaultMaxLookupWait   = time.Minute
	DefaultStoreTimeout    = 10 * time.Second
	// DefaultTombstoneRetention is how long a completed record stays a
	// tombstone after its retention.
	DefaultTombstoneRetention = 7 * 24 * time.Hour
	DefaultMaxTombstone       = 90 * 24 * time.Hour
)

// minRetryAfter is the least IN_PROGRESS hint, so that a lease about to run
// out never yields a retry storm with a zero delay.
const minRetryAfter = 10 * time.Millisecond

// Config configures a Ledger. The zero value works: every zero field takes
// the documented default.
type Config struct {
	DefaultLease     time.Duration // lease when a request sets none: 30 s
	MaxLease         time.Duration // the longest lease a request may ask: 1 h
	DefaultRetention time.Duration // retention when a request sets none: 24 h
	MaxRetention     time.Duration // the longest retention a request may ask: 7 days
	MaxOutcomeBytes  int           // the largest encoded outcome: 1 MiB
	MaxKeyBytes      int           // the longest key, at most 255: 255
	// MaxRetryAfter caps the IN_PROGRESS retry-after hint, which is otherwise
	// the time left on the lease: 2 s. Most first attempts finish long before
	// their lease runs out, so a waiting duplicate should look again soon.
	MaxRetryAfter time.Duration
	MaxLookupWait time.Duration // the longest wait of a Lookup: 1 min
	// StoreTimeout bounds every call to the store, whatever the caller's
	// deadline (a caller may have none): 10 s. A call past it is
	// UPSTREAM_TIMEOUT, retryable. A Lookup's wait is not counted.
	StoreTimeout time.Duration
	// DefaultTombstoneRetention is how long a completed record stays a
	// tombstone after its retention when a Begin does not say: 7 days. A
	// Begin on a tombstone with the same fingerprint is KEY_EXPIRED, never
	// a second run. Negative turns tombstones off by default.
	DefaultTombstoneRetention time.Duration
	// MaxTombstoneRetention is the longest tombstone retention a Begin may
	// ask: 90 days.
	MaxTombstoneRetention time.Duration
	// MaxWaiters bounds the Lookups with a wait that one namespace may
	// have waiting at once: 10,000. Past it, a Lookup with a wait is
	// RATE_LIMITED.
	MaxWaiters int
	// MaxWaitersTotal bounds the Lookups with a wait of every namespace
	// together (20,000): a few namespaces cannot each hold
	// MaxWaiters. Past it, a Lookup with a wait is RATE_LIMITED.
	MaxWaitersTotal int
	// PollInterval is how often the waiters' one shared poller reads the
	// waited scopes, for changes another ledger instance made: 250 ms.
	// Changes made by this Ledger wake the waiters at once.
	PollInterval time.Duration
}

func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.DefaultLease, DefaultLease)
	def(&c.MaxLease, DefaultMaxLease)
	def(&c.DefaultRetention, DefaultRetention)
	def(&c.MaxRetention, DefaultMaxRetention)
	def(&c.MaxRetryAfter, DefaultMaxRetryAfter)
	def(&c.MaxLookupWait, DefaultMaxLookupWait)
	def(&c.StoreTimeout, DefaultStoreTimeout)
	def(&c.PollInterval, DefaultPollInterval)
	def(&c.MaxTombstoneRetention, DefaultMaxTombstone)
	switch {
	case c.DefaultTombstoneRetention == 0:
		c.DefaultTombstoneRetention = DefaultTombstoneRetention
	case c.DefaultTombstoneRetention < 0:
		c.DefaultTombstoneRetention = 0
	}
	if c.MaxWaiters <= 0 {
		c.MaxWaiters = DefaultMaxWaiters
	}
	if c.MaxWaitersTotal <= 0 {
		c.MaxWaitersTotal = DefaultMaxWaitersTotal
	}
	if c.MaxOutcomeBytes <= 0 {
		c.MaxOutcomeBytes = DefaultMaxOutcomeBytes
	}
	if c.MaxKeyBytes <= 0 || c.MaxKeyBytes > MaxKeyBytes {
		c.MaxKeyBytes = MaxKeyBytes
	}
	return c
}

// Ledger applies the contract's rules on top of a Store. It validates every
// input, so a Store sees only well-formed requests. A Ledger is safe for
// concurrent use.
type Ledger struct {
	store   Store
	cfg     Config
	waiters waiters
	ending  atomic.Bool // EndWaits was called
}

// New returns a Ledger over store.
func New(store Store, cfg Config) *Ledger {
	return &Ledger{store: store, cfg: cfg.withDefaults()}
}

// Config returns the configuration in force, defaults applied.
func (l *Ledger) Config() Config { return l.cfg }

// BeginRequest asks to claim a scope.
type BeginRequest struct {
	Scope          Scope
	Fingerprint    string
	Method         string
	Lease          time.Duration // 0: the default
	Retention      time.Duration // 0: the default
	FirstAttemptAt time.Time     // zero: unknown
	OnLeaseExpiry  LeaseExpiry   // TAKEOVER unless HOLD
	// TombstoneRetention is how long the completed record stays a
	// tombstone after Retention: nil takes the default, 0 keeps none.
	TombstoneRetention *time.Duration
	// KeySource says where the caller found the key ("" says nothing);
	// the record keeps its first claim's.
	KeySource string
}

// Claim is held by the one attempt that may run the write.
type Claim struct {
	Token          uint64
	Attempt        uint32
	LeaseExpiresAt time.Time
	CreatedAt      time.Time // the record's: takeovers keep it
	ExpiresAt      time.Time // the end of the record's retention
}

// Replay is the stored outcome of a completed record.
type Replay struct {
	Outcome     *Outcome
	CompletedAt time.Time
	Attempt     uint32
}

// BeginResponse holds exactly one of Claim and Replay.
type BeginResponse struct {
	Claim  *Claim
	Replay *Replay
}

// Begin claims the scope or replays its stored outcome. It returns
// KEY_REUSED (metadata "method": the method that first used the key) for
// another fingerprint, IN_PROGRESS with a retry-after for a live lease,
// RETRY_TOO_LATE when FirstAttemptAt is older than the retention window and
// no record is left, VALIDATION_FAILED, KEY_MISSING or KEY_INVALID for bad
// input, and the store's UNAVAILABLE or CONTENTION.
func (l *Ledger) Begin(ctx context.Context, req BeginRequest) (resp BeginResponse, err error) {
	p := ClaimParams{
		Scope: req.Scope, Fingerprint: req.Fingerprint, Method: req.Method, Lease: req.Lease, Retention: req.Retention,
		FirstAttemptAt: req.FirstAttemptAt, OnLeaseExpiry: req.OnLeaseExpiry, TombstoneRetention: l.cfg.DefaultTombstoneRetention,
		KeySource: req.KeySource,
	}
	if req.TombstoneRetention != nil {
		p.TombstoneRetention = *req.TombstoneRetention
	}
	if err := l.validateClaim(&p); err != nil {
		return BeginResponse{}, err
	}
	ctx, span := storeSpan(ctx, "claim", p.Scope)
	defer func() { endBegin(span, resp, err) }()
	ctx, cancel := l.bound(ctx)
	defer cancel()
	res, err := l.store.Claim(ctx, p)
	if err != nil {
		return BeginResponse{}, err
	}
	rec := res.Record
	view := rec.View(res.Now)
	switch {
	case res.Claimed:
		return BeginResponse{Claim: &Claim{Token: rec.Token, Attempt: rec.Attempt, LeaseExpiresAt: rec.LeaseExpiresAt,
			CreatedAt: rec.CreatedAt, ExpiresAt: rec.ExpiresAt}}, nil
	case view == StateAbsent:
		return BeginResponse{}, errcode.Errorf(errcode.RetryTooLate,
			"the first attempt (%s) is older than the retention and tombstone windows (%s and %s); the ledger can no longer vouch for this intent",
			req.FirstAttemptAt.UTC().Format(time.RFC3339), p.Retention, p.TombstoneRetention)
	case rec.Fingerprint != p.Fingerprint:
		return BeginResponse{}, &errcode.Error{
			Code:     errcode.KeyReused,
			Message:  "the idempotency key was first used with another request",
			Metadata: map[string]string{"method": rec.Method},
		}
	case view == StateCompleted:
		return BeginResponse{Replay: &Replay{Outcome: rec.Outcome, CompletedAt: rec.CompletedAt, Attempt: rec.Attempt}}, nil
	case view == StateExpired:
		return BeginResponse{}, &errcode.Error{
			Code:     errcode.KeyExpired,
			Message:  "the write was done, but its answer is past its retention: it is not run again, and it cannot be replayed",
			Metadata: map[string]string{"completedAt": rec.CompletedAt.UTC().Format(time.RFC3339Nano)},
		}
	case view == StateUnknown:
		return BeginResponse{}, &errcode.Error{
			Code:    errcode.OutcomeUnknown,
			Message: "an attempt's lease ran out and nobody knows whether the write happened: it is not run again until the key is resolved",
			Metadata: map[string]string{
				"attempt": strconv.FormatUint(uint64(rec.Attempt), 10), "leaseExpiredAt": rec.LeaseExpiresAt.UTC().Format(time.RFC3339Nano),
			},
		}
	default:
		wait := min(max(rec.LeaseExpiresAt.Sub(res.Now), minRetryAfter), l.cfg.MaxRetryAfter)
		return BeginResponse{}, &errcode.Error{
			Code:       errcode.InProgress,
			Message:    "another attempt holds the key; retry later",
			RetryAfter: wait,
			Metadata:   map[string]string{"leaseExpiresAt": rec.LeaseExpiresAt.UTC().Format(time.RFC3339Nano)},
		}
	}
}

func (l *Ledger) validateClaim(p *ClaimParams) error {
	if err := ValidateScope(p.Scope, l.cfg.MaxKeyBytes); err != nil {
		return err
	}
	if err := ValidateFingerprint(p.Fingerprint); err != nil {
		return err
	}
	if err := ValidateMethod(p.Method); err != nil {
		return err
	}
	if err := ValidateKeySource(p.KeySource); err != nil {
		return err
	}
	var err error
	if p.Lease, err = duration("lease", p.Lease, l.cfg.DefaultLease, l.cfg.MaxLease); err != nil {
		return err
	}
	if p.Retention, err = duration("retention", p.Retention, l.cfg.DefaultRetention, l.cfg.MaxRetention); err != nil {
		return err
	}
	if p.Retention < p.Lease {
		return errcode.Errorf(errcode.ValidationFailed, "retention %s is shorter than the lease %s", p.Retention, p.Lease)
	}
	if p.TombstoneRetention < 0 || p.TombstoneRetention > l.cfg.MaxTombstoneRetention {
		return errcode.Errorf(errcode.ValidationFailed, "tombstone retention %s is outside 0 to %s", p.TombstoneRetention, l.cfg.MaxTombstoneRetention)
	}
	if p.OnLeaseExpiry != Takeover && p.OnLeaseExpiry != Hold {
		return errcode.Errorf(errcode.ValidationFailed, "on_lease_expiry %d is neither TAKEOVER nor HOLD", p.OnLeaseExpiry)
	}
	if !p.FirstAttemptAt.IsZero() && (p.FirstAttemptAt.Year() < 2000 || p.FirstAttemptAt.Year() > 9999) {
		return errcode.Errorf(errcode.ValidationFailed, "first_attempt_at is out of range")
	}
	return nil
}

// duration applies the default to a zero d and rejects a negative d or one
// above limit.
func duration(name string, d, def, limit time.Duration) (time.Duration, error) {
	switch {
	case d == 0:
		return def, nil
	case d < 0:
		return 0, errcode.Errorf(errcode.ValidationFailed, "%s %s is negative", name, d)
	case d > limit:
		return 0, errcode.Errorf(errcode.ValidationFailed, "%s %s is longer than the maximum %s", name, d, limit)
	}
	return d, nil
}

// Complete stores the outcome of the attempt that holds token and returns
// the completed record. It returns LEASE_LOST for anyone but the holder of
// the current token, OUTCOME_TOO_LARGE above the size limit, and
// VALIDATION_FAILED for a malformed outcome.
func (l *Ledger) Complete(ctx context.Context, s Scope, token uint64, o *Outcome) (Record, error) {
	if err := l.validateToken(s, token); err != nil {
		return Record{}, err
	}
	if err := l.checkOutcome(o); err != nil {
		return Record{}, err
	}
	ctx, span := storeSpan(ctx, "complete", s)
	ctx, cancel := l.bound(ctx)
	defer cancel()
	rec, err := l.store.Complete(ctx, CompleteParams{Scope: s, Token: token, Outcome: o})
	endSpan(span, err)
	if err == nil {
		l.waiters.notify(s)
	}
	return rec, err
}

// Release gives the scope back after an attempt that applied nothing. It
// returns LEASE_LOST for anyone but the holder of the current token of an
// IN_PROGRESS record.
func (l *Ledger) Release(ctx context.Context, s Scope, token uint64) error {
	if err := l.validateToken(s, token); err != nil {
		return err
	}
	ctx, span := storeSpan(ctx, "release", s)
	ctx, cancel := l.bound(ctx)
	defer cancel()
	err := l.store.Release(ctx, ReleaseParams{Scope: s, Token: token})
	endSpan(span, err)
	if err == nil {
		l.waiters.notify(s)
	}
	return err
}

// Extend renews the lease of the attempt that holds token for lease from
// now (0: the default) and returns the record. It returns LEASE_LOST when
// the token is fenced.
func (l *Ledger) Extend(ctx context.Context, s Scope, token uint64, lease time.Duration) (Record, error) {
	if err := l.validateToken(s, token); err != nil {
		return Record{}, err
	}
	lease, err := duration("lease", lease, l.cfg.DefaultLease, l.cfg.MaxLease)
	if err != nil {
		return Record{}, err
	}
	ctx, span := storeSpan(ctx, "extend", s)
	ctx, cancel := l.bound(ctx)
	defer cancel()
	rec, err := l.store.Extend(ctx, ExtendParams{Scope: s, Token: token, Lease: lease})
	endSpan(span, err)
	return rec, err
}

// Resolve settles a record whose outcome nobody knows: an OUTCOME_UNKNOWN
// record, or one in progress whose lease ran out. With an outcome (the
// write happened) the record is completed with it; with nil (it did not)
// the record becomes absent. It returns the record after the call (zero
// when absent), IN_PROGRESS for a live lease, VALIDATION_FAILED for a
// completed record or a malformed outcome, OUTCOME_TOO_LARGE, and
// NOT_FOUND.
func (l *Ledger) Resolve(ctx context.Context, s Scope, o *Outcome) (Record, error) {
	if err := ValidateScope(s, l.cfg.MaxKeyBytes); err != nil {
		return Record{}, err
	}
	if o != nil {
		if err := l.checkOutcome(o); err != nil {
			return Record{}, err
		}
	}
	ctx, span := storeSpan(ctx, "resolve", s)
	ctx, cancel := l.bound(ctx)
	defer cancel()
	rec, err := l.store.Resolve(ctx, ResolveParams{Scope: s, Outcome: o})
	endSpan(span, err)
	if err == nil {
		l.waiters.notify(s)
	}
	return rec, err
}

// bound is ctx bounded by StoreTimeout, for one call to the store; ctx
// itself when its deadline comes first (a guard's calls carry one), which
// saves a timer and a context a call.
func (l *Ledger) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= l.cfg.StoreTimeout {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, l.cfg.StoreTimeout)
}

// get is one bounded read of the store.
func (l *Ledger) get(ctx context.Context, s Scope) (Record, error) {
	ctx, cancel := l.bound(ctx)
	defer cancel()
	return l.store.Get(ctx, s)
}

// checkOutcome refuses a malformed outcome (VALIDATION_FAILED) and one
// over the size limit (OUTCOME_TOO_LARGE).
func (l *Ledger) checkOutcome(o *Outcome) error {
	if err := o.Validate(); err != nil {
		return err
	}
	if n := o.BinarySize(); n > l.cfg.MaxOutcomeBytes {
		return &errcode.Error{
			Code:     errcode.OutcomeTooLarge,
			Message:  "the outcome is larger than the limit",
			Metadata: map[string]string{"limitBytes": strconv.Itoa(l.cfg.MaxOutcomeBytes), "sizeBytes": strconv.Itoa(n)},
		}
	}
	return nil
}

func (l *Ledger) validateToken(s Scope, token uint64) error {
	if err := ValidateScope(s, l.cfg.MaxKeyBytes); err != nil {
		return err
	}
	if token == 0 {
		return errcode.Errorf(errcode.ValidationFailed, "token is missing")
	}
	return nil
}

// Lookup returns the live record of the scope or NOT_FOUND. With a wait
// (at most MaxLookupWait, else VALIDATION_FAILED) it waits, while the
// record is in progress, until it is completed or absent or the wait runs
// out, and then answers with the record as it is. A waiter is woken by the
// Complete or Release of this Ledger, or by the shared poller (changes made
// elsewhere); it makes no reads of its own while it waits. It returns
// RATE_LIMITED when the namespace has MaxWaiters waiting already, and
// UPSTREAM_TIMEOUT when ctx ends first.
func (l *Ledger) Lookup(ctx context.Context, s Scope, wait time.Duration) (Record, error) {
	type answer struct {
		rec Record
		err error
	}
	ch := make(chan answer, 1)
	l.LookupFunc(ctx, s, wait, func(rec Record, err error) { ch <- answer{rec, err} })
	a := <-ch
	return a.rec, a.err
}

// Store returns the store the ledger runs on.
func (l *Ledger) Store() Store { return l.store }
