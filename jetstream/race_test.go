//go:build race

package jetstream_test

// raceEnabled tells the tests that the race detector slows everything down some tenfold.
const raceEnabled = true
