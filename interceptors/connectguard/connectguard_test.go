package connectguard_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/connectguard"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/internal/testpb"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
	"github.com/idemledger/idemledger/server/servertest"
)

const procedure = testpb.InvoiceService_CreateInvoice_FullMethodName

// service is a connect-go handler of CreateInvoice, guarded, served on
// loopback over HTTP/1.1 and HTTP/2 without TLS: Connect, gRPC and
// gRPC-Web reach it on one port.
type service struct {
	runs atomic.Int64
	// fail, when set, is the error of the next run.
	fail atomic.Pointer[connect.Error]
}

func (s *service) create(_ context.Context, req *connect.Request[testpb.CreateInvoiceRequest]) (*connect.Response[testpb.CreateInvoiceResponse], error) {
	n := s.runs.Add(1)
	if ce := s.fail.Swap(nil); ce != nil {
		return nil, ce
	}
	return connect.NewResponse(&testpb.CreateInvoiceResponse{Invoice: &testpb.Invoice{
		Id: fmt.Sprintf("inv_%d", n), Number: n, CustomerId: req.Msg.GetCustomerId(), Currency: req.Msg.GetCurrency(),
	}}), nil
}

func serve(t *testing.T, opts ...connectguard.Option) (string, *service) {
	t.Helper()
	gd, err := guard.New(ledgerv1.NewLedgerServiceClient(servertest.NewServer(t, servertest.Ledger(servertest.MemoryLedger("invoices"))).Dial(t)))
	if err != nil {
		t.Fatal(err)
	}
	icpt, err := connectguard.New(gd, append([]connectguard.Option{
		connectguard.WithProcedure[testpb.CreateInvoiceResponse](procedure, connectguard.Procedure{Policy: guard.Policy{Lease: 5 * time.Second}}),
		connectguard.WithTenant(connectguard.TenantFromHeader("X-Tenant")),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	s := &service{}
	method := testpb.File_idemledger_testing_v1_invoice_proto.Services().ByName("InvoiceService").Methods().ByName("CreateInvoice")
	mux := http.NewServeMux()
	mux.Handle(procedure, connect.NewUnaryHandler(procedure, s.create, connect.WithSchema(method), connect.WithInterceptors(icpt)))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, Protocols: new(http.Protocols)}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l.Addr().String(), s
}

func request(key string, amount int64) *connect.Request[testpb.CreateInvoiceRequest] {
	req := connect.NewRequest(&testpb.CreateInvoiceRequest{CustomerId: "cus_1", Currency: "EUR",
		LineItems: []*testpb.LineItem{{Description: "seats", Quantity: 1, UnitAmountMicros: amount}}})
	req.Header().Set("X-Tenant", "acme")
	if key != "" {
		req.Header().Set(connectguard.KeyHeader, key)
	}
	return req
}

// TestConnectClient: a connect-go client (the Connect protocol, binary and
// JSON) sends a call and its retry with the same key, bare and quoted:
// one run, the same response, marked replayed. The key with another
// request is KEY_REUSED, typed in the error's details.
func TestConnectClient(t *testing.T) {
	t.Parallel()
	addr, s := serve(t)
	for _, codec := range []connect.ClientOption{connect.WithProtoJSON(), connect.WithClientOptions()} {
		client := connect.NewClient[testpb.CreateInvoiceRequest, testpb.CreateInvoiceResponse](http.DefaultClient, "http://"+addr+procedure, codec)
		key := fmt.Sprintf("0e03978e-%d", s.runs.Load())
		first, err := client.CallUnary(t.Context(), request(key, 100))
		if err != nil {
			t.Fatal(err)
		}
		again, err := client.CallUnary(t.Context(), request(`"`+key+`"`, 100))
		if err != nil || !proto.Equal(again.Msg, first.Msg) || again.Header().Get(connectguard.ReplayedHeader) != "true" {
			t.Fatalf("the retry: %v %v %v, want the replay of %v", err, again.Msg, again.Header(), first.Msg)
		}
		_, err = client.CallUnary(t.Context(), request(key, 200))
		if le := ledgerError(err); le.Code != errcode.KeyReused || connect.CodeOf(err) != connect.Code(ledgerstatus.GRPCCode(errcode.KeyReused)) {
			t.Fatalf("the key with another request: %v (%v)", err, le)
		}
	}
	if n := s.runs.Load(); n != 2 {
		t.Fatalf("%d runs, want 2", n)
	}
	// No key: KEY_MISSING, typed; a malformed one: KEY_INVALID.
	client := connect.NewClient[testpb.CreateInvoiceRequest, testpb.CreateInvoiceResponse](http.DefaultClient, "http://"+addr+procedure)
	if _, err := client.CallUnary(t.Context(), request("", 100)); ledgerError(err).Code != errcode.KeyMissing {
		t.Fatalf("no key: %v", err)
	}
	if _, err := client.CallUnary(t.Context(), request("a, b", 100)); ledgerError(err).Code != errcode.KeyInvalid {
		t.Fatalf("a list: %v", err)
	}
}

// TestHandlerErrorsAreStored: a handler's permanent error is stored and
// replayed with its code and details; a transient one is released, and
// the retry runs afresh.
func TestHandlerErrorsAreStored(t *testing.T) {
	t.Parallel()
	addr, s := serve(t)
	client := connect.NewClient[testpb.CreateInvoiceRequest, testpb.CreateInvoiceResponse](http.DefaultClient, "http://"+addr+procedure)
	s.fail.Store(connect.NewError(connect.CodeInvalidArgument, errors.New("no such customer")))
	_, first := client.CallUnary(t.Context(), request("refused", 100))
	_, again := client.CallUnary(t.Context(), request("refused", 100))
	var ce *connect.Error
	if connect.CodeOf(first) != connect.CodeInvalidArgument || !errors.As(again, &ce) || ce.Code() != connect.CodeInvalidArgument ||
		ce.Message() != "no such customer" || ce.Meta().Get(connectguard.ReplayedHeader) != "true" || s.runs.Load() != 1 {
		t.Fatalf("a stored error: %v, then %v, %d runs", first, again, s.runs.Load())
	}
	s.fail.Store(connect.NewError(connect.CodeUnavailable, errors.New("the database is down")))
	if _, err := client.CallUnary(t.Context(), request("transient", 100)); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("a transient error: %v", err)
	}
	if res, err := client.CallUnary(t.Context(), request("transient", 100)); err != nil || res.Header().Get(connectguard.ReplayedHeader) != "" || s.runs.Load() != 3 {
		t.Fatalf("after a transient error: %v %v, %d runs", err, res, s.runs.Load())
	}
}

// TestGRPCClient: grpc-go's generated client against the same connect-go
// handler (gRPC over HTTP/2): the key in metadata, the replay marked in
// the header metadata, and KEY_REUSED decoded from the status details as
// the gRPC adapter sends it.
func TestGRPCClient(t *testing.T) {
	t.Parallel()
	addr, s := serve(t)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	client := testpb.NewInvoiceServiceClient(conn)
	ctx := metadata.AppendToOutgoingContext(t.Context(), "x-tenant", "acme", "idempotency-key", "grpc-1")
	msg := request("", 100).Msg
	first, err := client.CreateInvoice(ctx, msg)
	if err != nil {
		t.Fatal(err)
	}
	var header metadata.MD
	again, err := client.CreateInvoice(ctx, msg, grpc.Header(&header))
	if err != nil || !proto.Equal(again, first) || strings.Join(header.Get("idempotency-replayed"), "") != "true" || s.runs.Load() != 1 {
		t.Fatalf("the retry: %v %v %v, %d runs", err, again, header, s.runs.Load())
	}
	changed := proto.CloneOf(msg)
	changed.CustomerId = "cus_2"
	_, err = client.CreateInvoice(ctx, changed)
	if le := ledgerstatus.FromError(err); le.Code != errcode.KeyReused {
		t.Fatalf("the key with another request over gRPC: %v (%v)", err, le)
	}
}

// TestCurlJSON: curl posts JSON with the Connect protocol, as a person
// would: the retry's body is the same bytes, and KEY_REUSED is a Connect
// JSON error whose details name the code.
func TestCurlJSON(t *testing.T) {
	t.Parallel()
	curl, err := exec.LookPath("curl")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("curl is needed: %v", err)
		}
		t.Skip("no curl")
	}
	addr, s := serve(t)
	post := func(body string) (string, string) {
		t.Helper()
		out, err := exec.CommandContext(t.Context(), curl, "-sS", "-D", "-", "-H", "Content-Type: application/json",
			"-H", "X-Tenant: acme", "-H", "Idempotency-Key: curl-1", "-d", body, "http://"+addr+procedure).CombinedOutput()
		if err != nil {
			t.Fatalf("curl: %v\n%s", err, out)
		}
		head, payload, _ := strings.Cut(string(out), "\r\n\r\n")
		return head, payload
	}
	body := `{"customerId":"cus_1","currency":"EUR","lineItems":[{"description":"seats","quantity":"1","unitAmountMicros":"100"}]}`
	_, first := post(body)
	head, again := post(body)
	if again != first || !strings.Contains(strings.ToLower(head), "idempotency-replayed: true") || !strings.Contains(first, `"inv_1"`) {
		t.Fatalf("curl's retry: %s %s, want the replay of %s", head, again, first)
	}
	head, reused := post(strings.Replace(body, "cus_1", "cus_2", 1))
	if !strings.Contains(head, " 400 ") && !strings.Contains(head, " 412 ") && !strings.Contains(head, " 409 ") || !strings.Contains(reused, `"idemledger.v1.ErrorDetail"`) {
		t.Fatalf("curl's reused key: %s %s", head, reused)
	}
	if n := s.runs.Load(); n != 1 {
		t.Fatalf("%d runs, want 1", n)
	}
}

// ledgerError is the ledger's typed error that a Connect error carries in
// its details.
func ledgerError(err error) *errcode.Error {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return &errcode.Error{}
	}
	for _, d := range ce.Details() {
		v, derr := d.Value()
		if ed, ok := v.(*ledgerv1.ErrorDetail); derr == nil && ok {
			return &errcode.Error{Code: errcode.Code(ed.GetCode()), Message: ce.Message()}
		}
	}
	return &errcode.Error{}
}
