//go:build race

package server

// raceEnabled: the tests run under -race, whose shadow memory and
// per-goroutine state add to every memory measurement.
const raceEnabled = true
