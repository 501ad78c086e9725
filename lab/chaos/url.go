package chaos

import (
	"fmt"
	"net/url"
)

// splitHost returns the database URL's host:port, and a function that puts
// another host:port in its place.
func splitHost(raw string) (func(hostport string) string, string, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return nil, "", fmt.Errorf("chaos: the database URL %q has no host", raw)
	}
	host := u.Host
	return func(hostport string) string {
		v := *u
		v.Host = hostport
		return v.String()
	}, host, nil
}
