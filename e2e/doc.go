// Package e2e holds SPACE's end-to-end tests: each test builds the real
// `space` binary, starts `space serve` as a separate process on loopback
// ports with its own data directory, and drives it over HTTP and through the
// CLI. Tests that need a real runtime say so; fault-injection tests use the
// FAKE runtime of a binary built with the spacefake tag, and say so in their
// names.
package e2e
