module github.com/idemledger/idemledger/interceptors/connectguard

go 1.26.0

require (
	connectrpc.com/connect v1.14.0
	github.com/idemledger/idemledger v0.0.0-00010101000000-000000000000
	go.opentelemetry.io/otel v1.3.0
	google.golang.org/grpc v1.66.0
	google.golang.org/protobuf v1.36.6
)

require (
	github.com/dunglas/httpsfv v1.1.0 // indirect
	github.com/go-logr/logr v1.2.1 // indirect
	github.com/go-logr/stdr v1.2.0 // indirect
	github.com/gowebpki/jcs v1.0.2 // indirect
	go.opentelemetry.io/otel/trace v1.3.0 // indirect
	golang.org/x/net v0.26.0 // indirect
	golang.org/x/sys v0.21.0 // indirect
	golang.org/x/text v0.16.0 // indirect
	golang.org/x/time v0.1.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20240604185151-ef581f913117 // indirect
)

replace github.com/idemledger/idemledger => ../..
