// Package dbfaults holds the tests of the faults between ledgerd and its
// database that a network makes: an answer lost after the database
// committed (the ambiguous commit), and a path that drops every packet for
// a while. They run the SQL store, or ledgerd itself, on a real PostgreSQL
// behind lab/faultproxy.
package dbfaults
