package guard

import (
	"net/http"

	"github.com/idemledger/idemledger/ledger/errcode"
)

// HeaderTenant returns the tenant named by the header name in h: the one
// rule behind the HTTP and MCP adapters' TenantFromHeader. A missing or
// empty header is VALIDATION_FAILED, naming it.
func HeaderTenant(h http.Header, name string) (string, error) {
	if v := h.Get(name); v != "" {
		return v, nil
	}
	return "", errcode.Errorf(errcode.ValidationFailed, "the call has no %s header", name)
}
