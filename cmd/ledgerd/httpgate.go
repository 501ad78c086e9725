package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"
	"unicode"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
	"github.com/idemledger/idemledger/server"
)

// bodyReadTimeout bounds the reading of a Connect unary call's body: a
// client that sends it a byte at a time is cut off.
const bodyReadTimeout = 10 * time.Second

// connectGate answers what the HTTP listener can refuse before vanguard
// transcodes a Connect unary call (a POST of JSON or protobuf to an RPC's
// path), typed as the same call over gRPC would be:
//
//   - the call is authenticated from its headers (the bearer token, or
//     the connection's client certificate) before its body is read, so an
//     unauthenticated caller costs no buffer: 401, UNAUTHENTICATED;
//   - the body is read within bodyReadTimeout, and at most limit bytes of
//     message: past it, 413 and OUTCOME_TOO_LARGE, not retryable (never
//     429, which says "retry later");
//   - a body that does not decode as the method's request (malformed or
//     truncated JSON, wrong types, duplicate or unknown fields, invalid
//     UTF-8, null, an array, an unknown Any type, nothing at all) is 400,
//     VALIDATION_FAILED.
//
// A Content-Type of application/json or application/proto with
// parameters (charset=utf-8) or in any letter case is the same media
// type. Other requests (gRPC, gRPC-Web, Connect streams) pass through.
func connectGate(next http.Handler, auth server.Authenticator, limit int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		codec, method, ok := connectUnary(r)
		if !ok {
			next.ServeHTTP(w, r)
			return
		}
		if _, err := auth.Authenticate(callContext(r.Context(), r)); err != nil {
			writeConnectError(w, http.StatusUnauthorized, err)
			return
		}
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(bodyReadTimeout))
		maxBody := int64(limit)
		if codec == "json" {
			maxBody = int64(jsonBodyLimit(limit))
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
		var tooLarge *http.MaxBytesError
		switch {
		case errors.As(err, &tooLarge):
			writeConnectError(w, http.StatusRequestEntityTooLarge, errcode.Errorf(errcode.OutcomeTooLarge,
				"the request body is over %d bytes, more than the ledger takes: do not retry it as it is", maxBody))
			return
		case err != nil:
			writeConnectError(w, http.StatusBadRequest, errcode.Errorf(errcode.ValidationFailed, "the request body did not arrive in time or whole"))
			return
		}
		_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
		msg, err := decodeRequest(method, codec, body)
		if err != nil {
			writeConnectError(w, http.StatusBadRequest, errcode.Errorf(errcode.ValidationFailed, "the request body is not a %s: %s", method.Input().FullName(), oneLine(err)))
			return
		}
		if n := proto.Size(msg); n > limit {
			writeConnectError(w, http.StatusRequestEntityTooLarge, errcode.Errorf(errcode.OutcomeTooLarge,
				"the request is %d bytes, more than the ledger takes (%d): do not retry it as it is", n, limit))
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		next.ServeHTTP(w, r)
	})
}

// jsonBodyLimit is the largest JSON body of a message of at most limit
// bytes: JSON carries bytes as base64, and names its fields.
func jsonBodyLimit(limit int) int { return 2*limit + 64<<10 }

// connectUnary reports whether r is a Connect unary call to a method of
// this process's registry, with its codec ("json" or "proto"). It sets
// the headers vanguard needs to see it so: Connect-Protocol-Version
// (optional for unary calls, and curl does not send it) and the bare
// media type.
func connectUnary(r *http.Request) (codec string, md protoreflect.MethodDescriptor, ok bool) {
	if r.Method != http.MethodPost || strings.Count(r.URL.Path, "/") != 2 {
		return "", nil, false
	}
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		return "", nil, false
	}
	switch mt {
	case "application/json":
		codec = "json"
	case "application/proto":
		codec = "proto"
	default:
		return "", nil, false
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return "", nil, false
	}
	service, name, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(service))
	if err != nil {
		return "", nil, false
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return "", nil, false
	}
	if md = sd.Methods().ByName(protoreflect.Name(name)); md == nil || md.IsStreamingClient() || md.IsStreamingServer() {
		return "", nil, false
	}
	r.Header.Set("Content-Type", mt)
	if r.Header.Get("Connect-Protocol-Version") == "" {
		r.Header.Set("Connect-Protocol-Version", "1")
	}
	return codec, md, true
}

// decodeRequest decodes body as the method's request: strictly, so that
// what vanguard would turn into an untyped error is refused here, typed.
func decodeRequest(md protoreflect.MethodDescriptor, codec string, body []byte) (proto.Message, error) {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Input().FullName())
	if err != nil {
		return nil, err
	}
	msg := mt.New().Interface()
	if codec == "proto" {
		return msg, proto.Unmarshal(body, msg)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, errors.New("the body is empty")
	}
	return msg, newOpaqueJSON(protoregistry.GlobalTypes).Unmarshal(body, msg) // as the transcoder will read it
}

// callContext is ctx carrying r's credentials as the authenticators read
// them: the Authorization headers as gRPC metadata, and the connection's
// TLS state as its peer.
func callContext(ctx context.Context, r *http.Request) context.Context {
	ctx = metadata.NewIncomingContext(ctx, metadata.MD{"authorization": r.Header.Values("Authorization")})
	if r.TLS != nil {
		ctx = peer.NewContext(ctx, &peer.Peer{AuthInfo: credentials.TLSInfo{State: *r.TLS}})
	}
	return ctx
}

// writeConnectError answers a Connect unary call with err as the typed
// status the ledger sends over gRPC: the Connect error's code, message
// and details (ErrorDetail, ErrorInfo, RetryInfo), under status.
func writeConnectError(w http.ResponseWriter, status int, err error) {
	st := ledgerstatus.Encode(err)
	type detail struct {
		Type  string `json:"type"`
		Value string `json:"value"`
	}
	body := struct {
		Code    string   `json:"code"`
		Message string   `json:"message"`
		Details []detail `json:"details,omitempty"`
	}{Code: connectCode(st.Code()), Message: st.Message()}
	for _, a := range st.Proto().GetDetails() {
		body.Details = append(body.Details, detail{
			Type:  strings.TrimPrefix(a.GetTypeUrl(), "type.googleapis.com/"),
			Value: base64.RawStdEncoding.EncodeToString(a.GetValue()),
		})
	}
	b, _ := json.Marshal(body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Connection", "close") // the rest of a refused body is not read
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// connectCode is the Connect protocol's name of a gRPC code:
// InvalidArgument is "invalid_argument".
func connectCode(c codes.Code) string {
	var b strings.Builder
	for i, r := range c.String() {
		if unicode.IsUpper(r) && i > 0 {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}

// oneLine is s on one line.
func oneLine(err error) string { return strings.Join(strings.Fields(fmt.Sprint(err)), " ") }
