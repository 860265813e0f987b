//go:build race

package server

// raceEnabled: the race detector's shadow memory and per-goroutine state
// add to every memory measurement.
const raceEnabled = true
