// Package console is ledgerd's operator console: web pages on the admin
// listener to find, read and settle records. Every page reads through
// AdminService, in process, under the signed-in admin's credentials, so
// that what the console does is authorized and audited as an idemctl call
// is. The pages are html/template (every value escaped), a style sheet
// and one small script, embedded in the binary; nothing is loaded from
// elsewhere.
package console

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"embed"
	"encoding/base64"
	"errors"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/internal/recordstate"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
	"github.com/idemledger/idemledger/server"
)

//go:embed templates/*.html
var templateFiles embed.FS

//go:embed static
var staticFiles embed.FS

// Prefix is where the console is served.
const Prefix = "/console/"

// SessionTTL is how long a sign-in lasts.
const SessionTTL = 8 * time.Hour

const cookieName = "idemledger_console"

// Config is what the console reads besides AdminService.
type Config struct {
	// Admin is ledgerd's AdminService.
	Admin ledgerv1.AdminServiceServer
	// Auth is ledgerd's authenticator: only an admin principal signs in.
	Auth server.Authenticator
	// Census is the latest count of records by namespace and state, and
	// when it was taken (zero before the first).
	Census func() (ledger.Census, time.Time)
	// Decisions is the ledger's decisions a minute over the last hour,
	// oldest first.
	Decisions func() []int
	// Ready says whether ledgerd serves: nil, or why not.
	Ready func(context.Context) error
	// Store names the store.
	Store string
	// Audit is the recent admin actions and refusals, newest first, and
	// with reads the recent reads (list, get) among them.
	Audit func(reads bool) []AuditEntry
	// Now is the clock of the sessions (time.Now when nil).
	Now func() time.Time
	// Log gets the console's own audit lines, as AdminService's go to
	// its log: sign-ins, refused sign-ins, sign-outs and refused forms.
	Log *slog.Logger
}

// Console serves the pages.
type Console struct {
	cfg   Config
	pages map[string]*template.Template
	mux   *http.ServeMux

	mu       sync.Mutex
	sessions map[string]*session
}

// session is one sign-in: the admin's token, which every AdminService
// call carries, or the certificate that signed it in, which every request
// of the session must present; and the CSRF token of its forms.
type session struct {
	token, who, csrf string
	cert             [sha256.Size]byte // zero for a token's session
	expires          time.Time
}

// New returns the console.
func New(cfg Config) (*Console, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	c := &Console{cfg: cfg, pages: map[string]*template.Template{}, sessions: map[string]*session{}, mux: http.NewServeMux()}
	for _, page := range []string{"login", "overview", "records", "record", "audit", "done"} {
		t, err := template.New(page+".html").Funcs(funcs).Funcs(template.FuncMap{
			// state is a record's state as every reader names it (recordstate), read now.
			"state": func(rec *ledgerv1.Record) string { return recordstate.Of(rec, c.cfg.Now()) },
		}).ParseFS(templateFiles, "templates/layout.html", "templates/"+page+".html")
		if err != nil {
			return nil, err
		}
		c.pages[page] = t
	}
	static, err := fs.Sub(staticFiles, "static")
	if err != nil {
		return nil, err
	}
	c.mux.Handle("GET "+Prefix+"static/", http.StripPrefix(Prefix+"static/", http.FileServerFS(static)))
	c.mux.HandleFunc("GET "+Prefix+"login", c.loginPage)
	c.mux.HandleFunc("POST "+Prefix+"login", c.login)
	c.mux.HandleFunc("POST "+Prefix+"logout", c.signedIn(c.logout))
	c.mux.HandleFunc("GET "+Prefix+"{$}", c.signedIn(c.overview))
	c.mux.HandleFunc("GET "+Prefix+"records", c.signedIn(c.records))
	c.mux.HandleFunc("GET "+Prefix+"record", c.signedIn(c.record))
	c.mux.HandleFunc("POST "+Prefix+"record/resolve", c.signedIn(c.resolve))
	c.mux.HandleFunc("POST "+Prefix+"record/purge", c.signedIn(c.purgeKey))
	c.mux.HandleFunc("POST "+Prefix+"tenant/purge", c.signedIn(c.purgeTenant))
	c.mux.HandleFunc("GET "+Prefix+"audit", c.signedIn(c.auditPage))
	return c, nil
}

// ServeHTTP serves the console's pages, each with a policy that runs no
// inline script, loads nothing from elsewhere and lets no page frame it.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin") // no-referrer would make a form's Origin "null"
	h.Set("Cache-Control", "no-store")
	c.mux.ServeHTTP(w, r)
}

// view is what every page gets.
type view struct {
	Title, Who, CSRF, Error string
	Data                    any
}

func (c *Console) render(w http.ResponseWriter, status int, page string, v view) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_ = c.pages[page].ExecuteTemplate(w, "layout", v)
}

// fail renders err as the page's answer: its code and message, and the
// HTTP status of its kind.
func (c *Console) fail(w http.ResponseWriter, s *session, err error) {
	le := ledgerstatus.FromError(err)
	status := http.StatusBadRequest
	switch le.Code {
	case errcode.Unauthenticated:
		status = http.StatusUnauthorized
	case errcode.PermissionDenied:
		status = http.StatusForbidden
	case errcode.NotFound:
		status = http.StatusNotFound
	case errcode.InProgress, errcode.OutcomeUnknown:
		status = http.StatusConflict
	case errcode.Unavailable, errcode.Internal, errcode.UpstreamTimeout:
		status = http.StatusServiceUnavailable
	}
	v := view{Title: "Refused", Error: le.Code.String() + ": " + le.Message}
	if s != nil {
		v.Who, v.CSRF = s.who, s.csrf
	}
	c.render(w, status, "done", v)
}

// loginPage asks for the admin token, or names the client certificate
// that signs the connection in.
func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	v := view{Title: "Sign in"}
	if leaf := verifiedLeaf(r); leaf != nil {
		v.Data = leaf.Subject.String()
	}
	c.render(w, http.StatusOK, "login", v)
}

// login signs an admin principal in: its token must authenticate, as an
// admin. A write service's token does not sign in.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if !sameOrigin(r) {
		c.render(w, http.StatusForbidden, "login", view{Title: "Sign in", Error: "the form came from another site"})
		return
	}
	token := strings.TrimSpace(r.PostFormValue("token"))
	p, err := c.authenticate(r.Context(), token)
	switch {
	case token == "" || err != nil:
		c.audit(r, "unauthenticated", "console sign-in refused", "reason", "unknown token")
		c.render(w, http.StatusUnauthorized, "login", view{Title: "Sign in", Error: "that token does not sign in"})
		return
	case p.Admin == "":
		c.audit(r, "namespace:"+p.Namespace, "console sign-in refused", "reason", "a write service's token")
		c.render(w, http.StatusForbidden, "login", view{Title: "Sign in", Error: "that token is a write service's (namespace " + p.Namespace + "): the console signs in admins only"})
		return
	}
	c.start(w, r, &session{token: token, who: p.Admin})
	c.audit(r, p.Admin, "console sign-in", "by", "token")
	http.Redirect(w, r, Prefix, http.StatusSeeOther)
}

// start keeps s as a new session, with its expiry and CSRF token, and
// sets its cookie.
func (c *Console) start(w http.ResponseWriter, r *http.Request, s *session) {
	id := random()
	s.csrf = random()
	c.mu.Lock()
	now := c.cfg.Now()
	for k, old := range c.sessions {
		if now.After(old.expires) {
			delete(c.sessions, k)
		}
	}
	s.expires = now.Add(SessionTTL)
	c.sessions[id] = s
	c.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: id, Path: Prefix, MaxAge: int(SessionTTL.Seconds()),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
}

// certificateSignIn signs in the admin whose verified client certificate
// the request's connection presents: with certificates, the certificate
// decides. It answers false when the request presents none, and refuses
// (answering the request itself) a certificate of no principal or a write
// service's.
func (c *Console) certificateSignIn(ctx context.Context, w http.ResponseWriter, r *http.Request) (*session, bool) {
	leaf := verifiedLeaf(r)
	if leaf == nil || c.cfg.Auth == nil {
		return nil, false
	}
	p, err := c.cfg.Auth.Authenticate(byCertificate(ctx, r))
	switch {
	case err != nil:
		c.audit(r, "unauthenticated", "console sign-in refused", "reason", "a certificate of no principal", "subject", leaf.Subject.String())
		c.render(w, http.StatusUnauthorized, "login", view{Title: "Sign in", Error: "the certificate this connection presents (" + leaf.Subject.String() + ") names no principal", Data: leaf.Subject.String()})
		return nil, true
	case p.Admin == "":
		c.audit(r, "namespace:"+p.Namespace, "console sign-in refused", "reason", "a write service's certificate")
		c.render(w, http.StatusForbidden, "login", view{Title: "Sign in", Error: "the certificate this connection presents is a write service's (namespace " + p.Namespace + "): the console signs in admins only", Data: leaf.Subject.String()})
		return nil, true
	}
	s := &session{who: p.Admin, cert: sha256.Sum256(leaf.Raw)}
	c.start(w, r, s)
	c.audit(r, p.Admin, "console sign-in", "by", "certificate", "subject", leaf.Subject.String())
	return s, true
}

// AdminOnly serves h to admin principals alone, named by their bearer
// token (Authorization: Bearer …) or, over TLS, their client certificate,
// as AdminService names them: a write service's credentials get 403, none
// or unknown ones 401, each refusal audited. For /debug/pprof/ on the
// admin listener, whose profiles show what the process holds.
func (c *Console) AdminOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var p server.Principal
		err := errors.New("no credentials")
		if token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			p, err = c.authenticate(r.Context(), strings.TrimSpace(token))
		} else if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 && c.cfg.Auth != nil {
			p, err = c.cfg.Auth.Authenticate(byCertificate(r.Context(), r))
		} else if c.cfg.Auth != nil {
			p, err = c.cfg.Auth.Authenticate(r.Context()) // dev mode names everyone its admin
		}
		switch {
		case err != nil:
			c.audit(r, "unauthenticated", "admin request refused", "path", r.URL.Path, "reason", "no admin credentials")
			w.Header().Set("WWW-Authenticate", `Bearer realm="ledgerd admin"`)
			http.Error(w, "UNAUTHENTICATED: an admin principal's bearer token or client certificate is required", http.StatusUnauthorized)
		case p.Admin == "":
			c.audit(r, "namespace:"+p.Namespace, "admin request refused", "path", r.URL.Path, "reason", "a write service's credentials")
			http.Error(w, "PERMISSION_DENIED: admin principals only", http.StatusForbidden)
		default:
			h.ServeHTTP(w, r)
		}
	})
}

func (c *Console) authenticate(ctx context.Context, token string) (server.Principal, error) {
	if c.cfg.Auth == nil {
		return server.Principal{}, errors.New("no authenticator")
	}
	return c.cfg.Auth.Authenticate(metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer "+token)))
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request, s *session) {
	c.mu.Lock()
	for k, v := range c.sessions {
		if v == s {
			delete(c.sessions, k)
		}
	}
	c.mu.Unlock()
	c.audit(r, s.who, "console sign-out")
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: Prefix, MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	http.Redirect(w, r, Prefix+"login", http.StatusSeeOther)
}

// signedIn runs h for a signed-in admin; a state-changing request must
// also carry the session's CSRF token and come from this origin.
func (c *Console) signedIn(h func(http.ResponseWriter, *http.Request, *session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s := c.session(r)
		if s == nil {
			var answered bool
			if s, answered = c.certificateSignIn(r.Context(), w, r); s == nil && answered {
				return
			}
		}
		if s == nil {
			if r.Method == http.MethodGet {
				http.Redirect(w, r, Prefix+"login", http.StatusSeeOther)
				return
			}
			c.fail(w, nil, errcode.Errorf(errcode.Unauthenticated, "sign in first"))
			return
		}
		if r.Method == http.MethodPost {
			if !sameOrigin(r) || subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(s.csrf)) != 1 {
				c.audit(r, s.who, "console request refused", "path", r.URL.Path, "reason", "no CSRF token, a wrong one, or another origin")
				c.fail(w, s, errcode.Errorf(errcode.PermissionDenied, "the form's CSRF token is missing or wrong: reload the page and try again"))
				return
			}
		}
		h(w, r, s)
	}
}

func (c *Console) session(r *http.Request) *session {
	ck, err := r.Cookie(cookieName)
	if err != nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sessions[ck.Value]
	if s == nil || c.cfg.Now().After(s.expires) {
		delete(c.sessions, ck.Value)
		return nil
	}
	if s.cert != ([sha256.Size]byte{}) {
		// A certificate's session lasts while its connections present
		// that certificate.
		if leaf := verifiedLeaf(r); leaf == nil || sha256.Sum256(leaf.Raw) != s.cert {
			return nil
		}
	}
	return s
}

// audit writes one of the console's audit lines, as AdminService writes
// its own.
func (c *Console) audit(r *http.Request, principal, what string, attrs ...any) {
	c.cfg.Log.InfoContext(r.Context(), "audit: "+what, append([]any{"audit", true, "principal", principal, "remote", r.RemoteAddr}, attrs...)...)
}

// sameOrigin says whether a form was posted from this host: its Origin,
// when the browser sends one, names it.
func sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	u, err := url.Parse(o)
	return err == nil && u.Host == r.Host
}

// as is r's context carrying the session's credentials, as AdminService
// reads them: its token, or the certificate r's connection presents.
func (s *session) as(r *http.Request) context.Context {
	if s.cert != ([sha256.Size]byte{}) {
		return byCertificate(r.Context(), r)
	}
	return metadata.NewIncomingContext(r.Context(), metadata.Pairs("authorization", "Bearer "+s.token))
}

// byCertificate is ctx carrying r's connection's TLS state as a gRPC
// peer's, which is where server.Certificates reads the certificate.
func byCertificate(ctx context.Context, r *http.Request) context.Context {
	return peer.NewContext(ctx, &peer.Peer{Addr: remoteAddr(r.RemoteAddr), AuthInfo: credentials.TLSInfo{State: *r.TLS}})
}

// verifiedLeaf is the client certificate of r's connection when its chain
// verified against the client CA, or nil.
func verifiedLeaf(r *http.Request) *x509.Certificate {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return nil
	}
	return r.TLS.VerifiedChains[0][0]
}

// remoteAddr is a request's RemoteAddr as a net.Addr.
type remoteAddr string

func (a remoteAddr) Network() string { return "tcp" }
func (a remoteAddr) String() string  { return string(a) }

func random() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}
