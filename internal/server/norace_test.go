//go:build !race

package server

// raceEnabled: the tests run under -race.
const raceEnabled = false
