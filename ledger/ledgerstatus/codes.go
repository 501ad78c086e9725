package ledgerstatus

import (
	"google.golang.org/grpc/codes"

	"github.com/idemledger/idemledger/ledger/errcode"
)

// grpcCodes is the gRPC status code each code of the taxonomy travels as;
// tests pin it to docs/contract.md's table.
var grpcCodes = map[errcode.Code]codes.Code{
	errcode.RateLimited:      codes.ResourceExhausted,
	errcode.Unavailable:      codes.Unavailable,
	errcode.UpstreamTimeout:  codes.DeadlineExceeded,
	errcode.InProgress:       codes.Aborted,
	errcode.Contention:       codes.Aborted,
	errcode.ValidationFailed: codes.InvalidArgument,
	errcode.KeyMissing:       codes.InvalidArgument,
	errcode.KeyInvalid:       codes.InvalidArgument,
	errcode.KeyReused:        codes.FailedPrecondition,
	errcode.LeaseLost:        codes.FailedPrecondition,
	errcode.RetryTooLate:     codes.FailedPrecondition,
	errcode.OutcomeTooLarge:  codes.InvalidArgument,
	errcode.NotFound:         codes.NotFound,
	errcode.Unauthenticated:  codes.Unauthenticated,
	errcode.PermissionDenied: codes.PermissionDenied,
	errcode.Internal:         codes.Internal,
	errcode.OutcomeUnknown:   codes.FailedPrecondition,
	errcode.KeyExpired:       codes.FailedPrecondition,
}

// GRPCCode returns the gRPC status code c travels as. Unknown codes travel
// as INTERNAL.
func GRPCCode(c errcode.Code) codes.Code {
	if g, ok := grpcCodes[c]; ok {
		return g
	}
	return codes.Internal
}
