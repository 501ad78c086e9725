package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"testing"

	"github.com/getkin/kin-openapi/openapi2"
	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"

	"github.com/idemledger/idemledger/cmd/ledgerd/internal/openapiclient"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

// TestOpenAPIClient: the OpenAPI documents of the HTTP/JSON API, generated
// from proto/ (gen/openapi: 2.0 from protoc-gen-openapiv2, 3.0 from it),
// pass kin-openapi's validation; a client generated from the 3.0 one
// (oapi-codegen) claims, completes and replays a key against a real
// ledgerd, and each request and answer of the round trip is checked
// against the document's operation by kin-openapi's validator.
func TestOpenAPIClient(t *testing.T) {
	t.Parallel() // its own process and directory
	b, err := os.ReadFile("../../gen/openapi/idemledger.swagger.json")
	if err != nil {
		t.Fatal(err)
	}
	var v2 openapi2.T
	if err := json.Unmarshal(b, &v2); err != nil {
		t.Fatalf("the OpenAPI 2.0 document: %v", err)
	}
	doc, err := openapi3.NewLoader().LoadFromFile("../../gen/openapi/idemledger.openapi3.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(t.Context()); err != nil {
		t.Fatalf("the OpenAPI 3.0 document does not validate: %v", err)
	}
	if len(v2.Paths) != doc.Paths.Len() || doc.Paths.Find("/idemledger.v1.LedgerService/Begin") == nil {
		t.Fatalf("the documents name %d and %d paths", len(v2.Paths), doc.Paths.Len())
	}

	p, token := withToken(t)
	p.waitServing(t, p.dial(t))
	checked := 0
	client, err := openapiclient.NewClientWithResponses("http://"+p.http,
		openapiclient.WithRequestEditorFn(func(_ context.Context, req *http.Request) error {
			req.Header.Set("Authorization", "Bearer "+token)
			return nil
		}),
		openapiclient.WithHTTPClient(validating{t: t, doc: doc, checked: &checked}))
	if err != nil {
		t.Fatal(err)
	}
	str := func(s string) *string { return &s }
	begin := openapiclient.V1BeginRequest{Tenant: str("acme"), Key: str("k-openapi"), Fingerprint: str(ledgertest.Fingerprint("p")), Method: str("http:POST /v1/invoices")}
	claimed, err := client.LedgerServiceBeginWithResponse(t.Context(), begin)
	if err != nil || claimed.JSON200 == nil || claimed.JSON200.Claim == nil || *claimed.JSON200.Claim.Token != "1" {
		t.Fatalf("Begin: %v %s", err, claimed.Body)
	}
	outcome := &openapiclient.V1Outcome{Response: &openapiclient.ProtobufAny{Type: str("type.googleapis.com/google.protobuf.StringValue"),
		AdditionalProperties: map[string]any{"value": "inv_0042"}}}
	done, err := client.LedgerServiceCompleteWithResponse(t.Context(), openapiclient.V1CompleteRequest{Tenant: str("acme"), Key: str("k-openapi"), Token: str("1"), Outcome: outcome})
	if err != nil || done.JSON200 == nil {
		t.Fatalf("Complete: %v %s", err, done.Body)
	}
	replayed, err := client.LedgerServiceBeginWithResponse(t.Context(), begin)
	if err != nil || replayed.JSON200 == nil || replayed.JSON200.Replay == nil {
		t.Fatalf("the replay: %v %s", err, replayed.Body)
	}
	if got := replayed.JSON200.Replay.Outcome.Response; *got.Type != *outcome.Response.Type || got.AdditionalProperties["value"] != "inv_0042" {
		t.Fatalf("the replay's outcome: %+v", got)
	}
	if checked != 3 {
		t.Fatalf("%d exchanges checked against the document, want 3", checked)
	}
}

// validating is an HTTP client that checks each request and its answer
// against the document's operation for the request's path.
type validating struct {
	t       *testing.T
	doc     *openapi3.T
	checked *int
}

func (v validating) Do(req *http.Request) (*http.Response, error) {
	item := v.doc.Paths.Find(req.URL.Path)
	if item == nil || item.Post == nil {
		v.t.Fatalf("the document has no POST %s", req.URL.Path)
	}
	route := &routers.Route{Spec: v.doc, Path: req.URL.Path, PathItem: item, Method: http.MethodPost, Operation: item.Post}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	in := &openapi3filter.RequestValidationInput{Request: req.Clone(req.Context()), Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}}
	in.Request.Body = io.NopCloser(bytes.NewReader(body))
	if err := openapi3filter.ValidateRequest(req.Context(), in); err != nil {
		v.t.Errorf("the request to %s does not match the document: %v", req.URL.Path, err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	answer, err := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if err != nil {
		return nil, err
	}
	res.Body = io.NopCloser(bytes.NewReader(answer))
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: res.StatusCode, Header: res.Header,
		Body: io.NopCloser(bytes.NewReader(answer)), Options: &openapi3filter.Options{IncludeResponseStatus: true}}
	if err := openapi3filter.ValidateResponse(req.Context(), out); err != nil {
		v.t.Errorf("the answer of %s does not match the document: %v\n%s", req.URL.Path, err, answer)
	}
	*v.checked++
	return res, nil
}
