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
	// State, when set, keeps the records that read in that state as of
	// the page's Now; StateAbsent keeps every live record.
	State State
	// After is the last scope of the previous page: the listing resumes
	// after it. Zero starts at the beginning.
	After Scope
	// Limit is the most records a page holds. Scan, when larger, is the
	// most rows a page reads while it looks for records in State; 0 means
	// Limit.
	Limit int
	Scan  int
}

// rows is the most rows a page of p reads.
func (p ListParams) rows() int { return max(p.Limit, p.Scan) }

// ListPage is a page of Store.List.
type ListPage struct {
	Records []Record // the live records read, as of Now, in State
	// Last is the last row read, where the next page resumes (zero when
	// none was); More says there may be rows after it.
	Last Scope
	More bool
	Now  time.Time
}

// Lister builds a ListPage row by row, for a store that reads the rows
// itself in order: it keeps each row that is live and in the state
// asked, and says when the page is done.
type Lister struct {
	p    ListParams
	read int
	Page ListPage
}

// NewLister starts a page of p as of now.
func NewLister(p ListParams, now time.Time) *Lister {
	return &Lister{p: p, Page: ListPage{Now: now}}
}

// Full reports whether the page is done before the next row: it holds
// Limit records, or read the rows it may. A store that has a next row
// calls it before reading it, and stops when it answers true (the page
// then has More set).
func (l *Lister) Full() bool {
	if len(l.Page.Records) >= l.p.Limit || l.read >= l.p.rows() {
		l.Page.More = true
		return true
	}
	return false
}

// Add takes the next row.
func (l *Lister) Add(rec *Record) {
	l.read++
	l.Page.Last = rec.Scope
	if live, ok := rec.AsOf(l.Page.Now); ok && (l.p.State == StateAbsent || live.State == l.p.State) {
		l.Page.Records = append(l.Page.Records, live)
	}
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
	// ListScanRows is how many rows one page of a listing by state reads
	// at most while it looks for records in that state: such a page may
	// come back short, or empty, with a next page.
	ListScanRows     = 50000
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
// order of tenant and key, those in req.State only when it is set. A page
// by state reads at most ListScanRows rows, so it may come back short, or
// empty, with More set.
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
	p := ListParams{Namespace: req.Namespace, Tenant: req.Tenant, State: req.State, After: req.After, Limit: req.PageSize}
	if req.State != StateAbsent {
		p.Scan = ListScanRows
	}
	ctx, cancel := l.bound(ctx)
	defer cancel()
	page, err := l.store.List(ctx, p)
	if err != nil {
		return ListResult{}, err
	}
	res := ListResult{Records: page.Records, Next: req.After, More: page.More}
	if page.Last != (Scope{}) {
		res.Next = page.Last
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
