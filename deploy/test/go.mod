module github.com/idemledger/idemledger/deploy/test

go 1.26.0

require github.com/idemledger/idemledger v0.0.0

replace github.com/idemledger/idemledger => ../..
