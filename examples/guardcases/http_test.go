package guardcases_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/httpguard"
)

// The same table over HTTP, against httpguard: a step is a POST of its
// arguments as the JSON body, its key in the Idempotency-Key header (a
// key that is not ASCII goes as two header lines, which is as malformed
// over HTTP); the tool's text is a 201 with that body, its error text a
// 422 (stored), the case's transient text a 503 (released), an unknown
// run a 502 marked unknown. An expected text is the body (and 422 when
// is_error), replayed is Idempotency-Replayed, an expected error the
// problem's code and retryable.

func TestGuardCasesHTTP(t *testing.T) {
	forEachCase(t, "http", runHTTPCase)
}

func runHTTPCase(t *testing.T, c tcase, gd *guard.Guard, pass func(time.Duration), keyPrefix string) {
	route := httpguard.Route{Policy: policyOf(c)}
	if text := c.Policy.ReconcileText; text != "" {
		route.Reconcile = func(*http.Request) (*httpguard.Response, error) {
			return &httpguard.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"text/plain"}}, Body: []byte(text)}, nil
		}
	}
	opts := []httpguard.Option{httpguard.WithTenant(httpguard.Tenant("acme")), httpguard.WithRoute("POST /v1/invoices", route)}
	if c.MaxBodyBytes > 0 {
		opts = append(opts, httpguard.WithMaxBodyBytes(c.MaxBodyBytes))
	}
	hg, err := httpguard.New(gd, opts...)
	if err != nil {
		t.Fatal(err)
	}
	var current, runs atomic.Int64
	g := newGate()
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		st := c.Steps[current.Load()]
		if st.Tool.Hold {
			g.hold()
		}
		status, text := http.StatusCreated, st.Tool.Text
		switch {
		case st.Tool.Unknown:
			httpguard.MarkOutcomeUnknown(r)
			status = http.StatusBadGateway
		case st.Tool.ErrorText != "" && st.Tool.ErrorText == c.Policy.TransientText:
			status, text = http.StatusServiceUnavailable, st.Tool.ErrorText
		case st.Tool.ErrorText != "":
			status, text = http.StatusUnprocessableEntity, st.Tool.ErrorText
		case st.Tool.TextBytes > 0:
			text = strings.Repeat("x", st.Tool.TextBytes)
		case st.Tool.TokenText:
			cl, _ := guard.ClaimFromContext(r.Context())
			text = fmt.Sprintf("token %d, attempt %d", cl.Token, cl.Attempt)
		}
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, text)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /v1/invoices", hg.Middleware(handler))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	drive(t, c, &g, pass, func(i int) { current.Store(int64(i)) }, func(st step) answer { return post(t, srv.URL+"/v1/invoices", keyPrefix, st) })
	if runs.Load() != c.Runs {
		t.Errorf("the handler ran %d times, want %d", runs.Load(), c.Runs)
	}
}

// post sends one step and reads its answer as the table writes it.
func post(t *testing.T, url, keyPrefix string, st step) answer {
	ctx := context.Background()
	if st.HangUpMS > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(st.HangUpMS)*time.Millisecond)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader([]byte(st.Args)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	switch {
	case st.Key == "":
	case strings.ContainsFunc(st.Key, func(r rune) bool { return r > 0x7e }):
		req.Header["Idempotency-Key"] = []string{"a", "b"} // malformed, as the table's key is
	default:
		req.Header.Set("Idempotency-Key", keyPrefix+st.Key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil && ctx.Err() != nil {
		return answer{Error: "HUNG_UP"}
	}
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	if res.Header.Get("Content-Type") == "application/problem+json" {
		var p struct {
			Code      string `json:"code"`
			Retryable bool   `json:"retryable"`
		}
		if err := json.Unmarshal(body, &p); err != nil {
			t.Fatal(err)
		}
		return answer{Error: p.Code, Retryable: p.Retryable, Status: res.StatusCode}
	}
	a := answer{Text: string(body), Status: res.StatusCode, Replayed: res.Header.Get("Idempotency-Replayed") == "true",
		IsError: res.StatusCode == http.StatusUnprocessableEntity || res.StatusCode == http.StatusServiceUnavailable}
	if len(body) > 1024 {
		a.Text, a.TextBytes = "", len(body)
	}
	return a
}
