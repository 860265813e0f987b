//go:build !race

package e2e

// raceEnabled: the tests run without -race; so is the server build.
const raceEnabled = false
