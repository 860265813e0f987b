// Package archtest holds project rules written as tests: today, that
// imports between Quill's packages point downward only (ARCHITECTURE.md,
// "Layers"). It contains no code.
package archtest
