// Package streamcall names the calls on LedgerService's Stream, for the
// spans of the client (ledgerclient) and of the server.
package streamcall

import ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"

// Name is the full name of the unary method a call on a Stream stands
// for, such as "idemledger.v1.LedgerService/Begin"; FullMethod is it as
// gRPC names a method, "/idemledger.v1.LedgerService/Begin". Both are
// constants: naming a call allocates nothing.
func Name(req *ledgerv1.StreamRequest) string { return names[kind(req)][1:] }

// FullMethod is the method as grpc.UnaryServerInfo names it.
func FullMethod(req *ledgerv1.StreamRequest) string { return names[kind(req)] }

var names = func() [7]string {
	var n [7]string
	for i, m := range []string{"Stream", "Begin", "Complete", "Release", "Extend", "Lookup", "Resolve"} {
		n[i] = "/" + ledgerv1.LedgerService_ServiceDesc.ServiceName + "/" + m
	}
	return n
}()

func kind(req *ledgerv1.StreamRequest) int {
	switch req.GetCall().(type) {
	case *ledgerv1.StreamRequest_Begin:
		return 1
	case *ledgerv1.StreamRequest_Complete:
		return 2
	case *ledgerv1.StreamRequest_Release:
		return 3
	case *ledgerv1.StreamRequest_Extend:
		return 4
	case *ledgerv1.StreamRequest_Lookup:
		return 5
	case *ledgerv1.StreamRequest_Resolve:
		return 6
	}
	return 0
}
