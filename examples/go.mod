module github.com/idemledger/idemledger/examples

go 1.26.0

require (
	connectrpc.com/connect v1.21.1
	github.com/google/jsonschema-go v0.4.3
	github.com/grpc-ecosystem/go-grpc-middleware/v2 v2.3.4
	github.com/idemledger/idemledger v0.0.0-00010101000000-000000000000
	github.com/idemledger/idemledger/interceptors/fence v0.0.0-00010101000000-000000000000
	github.com/idemledger/idemledger/interceptors/mcpguard v0.0.0-00010101000000-000000000000
	github.com/jackc/pgx/v5 v5.5.0
	github.com/modelcontextprotocol/go-sdk v1.8.0
	github.com/stripe/stripe-go/v82 v82.5.1
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20221227161230-091c0ba34f0a // indirect
	github.com/jackc/puddle/v2 v2.2.1 // indirect
	golang.org/x/crypto v0.57.0 // indirect
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/dunglas/httpsfv v1.1.2 // indirect
	github.com/go-logr/logr v1.4.4 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/gowebpki/jcs v1.0.2 // indirect
	github.com/idemledger/idemledger/interceptors/connectguard v0.0.0-00010101000000-000000000000
	github.com/segmentio/asm v1.1.3 // indirect
	github.com/segmentio/encoding v0.5.4 // indirect
	github.com/yosida95/uritemplate/v3 v3.0.2 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/otel v1.47.0 // indirect
	go.opentelemetry.io/otel/log v1.47.0 // indirect
	go.opentelemetry.io/otel/metric v1.47.0 // indirect
	go.opentelemetry.io/otel/trace v1.47.0 // indirect
	go.yaml.in/yaml/v3 v3.0.6 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/oauth2 v0.36.0 // indirect
	golang.org/x/sync v0.23.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	golang.org/x/time v0.16.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261110000943-09e21b237f2c // indirect
)

replace github.com/idemledger/idemledger/interceptors/mcpguard => ../interceptors/mcpguard

replace github.com/idemledger/idemledger => ..

replace github.com/idemledger/idemledger/interceptors/fence => ../interceptors/fence

replace github.com/idemledger/idemledger/interceptors/connectguard => ../interceptors/connectguard
