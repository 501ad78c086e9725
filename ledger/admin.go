package ledger

import (
	"context"
	"time"

	"github.com/idemledger/idemledger/ledger/errcode"
)

// ListParams are the inputs of Store.List.
type ListParams struct {
	Namespace string
	Tenant    string // "" lists every tenant of the namespace
	// After is the last scope of the previous page: the listing resumes
	// after it. Zero starts at the beginning.
	After Scope
	Limit int
}

// ListPage is a page of Store.List.
type ListPage struct {
	Records []Record // the live records read, as of Now
	// Scanned counts the rows read; Last is the last of them, where the
	// next page resumes; More says there may be rows after it.
	Scanned int
	Last    Scope
	More    bool
	Now     time.Time
}

// PurgeParams are the inputs of Store.Purge.
type PurgeParams struct {
	// Scope names one record, or with Key "" every record of the tenant.
	Scope Scope
	Limit int // the most records a tenant purge erases
}

// PurgeResult is the answer of Store.Purge.
type PurgeResult struct {
	Purged int
	// Skipped counts the records of the key or tenant that an attempt
	// holds or whose outcome is unknown: they are not erased.
	Skipped int
	More    bool // a tenant purge stopped at Limit with more to erase
}

// Purgeable reports whether an operator may erase a record as it reads
// now: not while an attempt holds it or its outcome is unknown, since its
// holder may still complete it, and a row erased would let a new claim
// start again at token 1.
func (r *Record) Purgeable(now time.Time) bool {
	v := r.View(now)
	return v != StateInProgress && v != StateUnknown
}

// Bounds of the admin calls.
const (
	DefaultListPage = 100
	MaxListPage     = 1000
	// listScanPages is how many pages of rows one List reads at most while
	// it looks for records in the state asked: a page may come back short.
	listScanPages    = 10
	DefaultPurgeSize = 1000
	MaxPurgeSize     = 10000
)

// ListRequest is the input of Ledger.List.
type ListRequest struct {
	Namespace string
	Tenant    string
	State     State // StateAbsent: every state
	PageSize  int
	After     Scope
}

// ListResult is a page of Ledger.List.
type ListResult struct {
	Records []Record
	// Next is where the next page starts; More says there is one.
	Next Scope
	More bool
}

// List returns a page of the live records of a namespace (and tenant), in
// order of tenant and key, those in req.State only when it is set. It
// reads at most ten store pages of req.PageSize rows, so a page that
// filters by state may come back short, or empty, with More set.
func (l *Ledger) List(ctx context.Context, req ListRequest) (ListResult, error) {
	if err := ValidateScope(Scope{Namespace: req.Namespace, Tenant: orX(req.Tenant), Key: "x"}, l.cfg.MaxKeyBytes); err != nil {
		return ListResult{}, err
	}
	switch {
	case req.PageSize == 0:
		req.PageSize = DefaultListPage
	case req.PageSize < 0 || req.PageSize > MaxListPage:
		return ListResult{}, errcode.Errorf(errcode.ValidationFailed, "page size %d is outside 1 to %d", req.PageSize, MaxListPage)
	}
	if req.After != (Scope{}) && (req.After.Namespace != req.Namespace || (req.Tenant != "" && req.After.Tenant != req.Tenant)) {
		return ListResult{}, errcode.Errorf(errcode.ValidationFailed, "the page token belongs to another listing")
	}
	res := ListResult{Next: req.After}
	for range listScanPages {
		ctx, cancel := l.bound(ctx)
		page, err := l.store.List(ctx, ListParams{Namespace: req.Namespace, Tenant: req.Tenant, After: res.Next, Limit: req.PageSize})
		cancel()
		if err != nil {
			return ListResult{}, err
		}
		for _, rec := range page.Records {
			if req.State == StateAbsent || rec.State == req.State {
				res.Records = append(res.Records, rec)
			}
		}
		res.More = page.More
		if page.Scanned > 0 {
			res.Next = page.Last
		}
		if !page.More || len(res.Records) >= req.PageSize {
			break
		}
	}
	if len(res.Records) > req.PageSize {
		// The last store page matched more than the page holds: resume
		// after the last record kept.
		res.Records = res.Records[:req.PageSize]
		res.Next, res.More = res.Records[len(res.Records)-1].Scope, true
	}
	return res, nil
}

// Get returns one record as it reads now, of any namespace, or NOT_FOUND.
func (l *Ledger) Get(ctx context.Context, s Scope) (Record, error) {
	if err := ValidateScope(s, l.cfg.MaxKeyBytes); err != nil {
		return Record{}, err
	}
	return l.get(ctx, s)
}

// Purge erases one record (s.Key set) or up to limit records of a tenant
// (s.Key ""). A record in progress or whose outcome is unknown is not
// erased: a key purge refuses it (IN_PROGRESS, or VALIDATION_FAILED for an
// unknown outcome: resolve it first), a tenant purge skips it.
func (l *Ledger) Purge(ctx context.Context, s Scope, limit int) (PurgeResult, error) {
	key := s.Key
	s.Key = orX(s.Key)
	if err := ValidateScope(s, l.cfg.MaxKeyBytes); err != nil {
		return PurgeResult{}, err
	}
	s.Key = key
	switch {
	case limit == 0:
		limit = DefaultPurgeSize
	case limit < 0 || limit > MaxPurgeSize:
		return PurgeResult{}, errcode.Errorf(errcode.ValidationFailed, "limit %d is outside 1 to %d", limit, MaxPurgeSize)
	}
	ctx, cancel := l.bound(ctx)
	defer cancel()
	res, err := l.store.Purge(ctx, PurgeParams{Scope: s, Limit: limit})
	if err != nil {
		return res, err
	}
	if key != "" && res.Skipped > 0 {
		return res, errcode.Errorf(errcode.ValidationFailed, "the record is in progress or its outcome is unknown: resolve it, or let its lease run out, before purging it")
	}
	return res, nil
}

func orX(s string) string {
	if s == "" {
		return "x"
	}
	return s
}
