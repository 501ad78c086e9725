// Package streamcall names the calls on LedgerService's Stream, for the
// spans of the client (ledgerclient) and of the server.
package streamcall

import ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"

// Name is the full name of the unary method a call on a Stream stands
// for, such as "idemledger.v1.LedgerService/Begin".
func Name(req *ledgerv1.StreamRequest) string {
	name := "Stream"
	switch req.GetCall().(type) {
	case *ledgerv1.StreamRequest_Begin:
		name = "Begin"
	case *ledgerv1.StreamRequest_Complete:
		name = "Complete"
	case *ledgerv1.StreamRequest_Release:
		name = "Release"
	case *ledgerv1.StreamRequest_Extend:
		name = "Extend"
	case *ledgerv1.StreamRequest_Lookup:
		name = "Lookup"
	case *ledgerv1.StreamRequest_Resolve:
		name = "Resolve"
	}
	return ledgerv1.LedgerService_ServiceDesc.ServiceName + "/" + name
}
