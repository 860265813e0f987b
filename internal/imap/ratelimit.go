package imap

import "time"

// commandBucket is a token bucket of commands (issue 3 item 5: commands
// per second per connection). It holds at most burst tokens, gains rate
// tokens per second, and each command takes one; a command that finds
// less than one is refused with NO [LIMIT] (RFC 5530) without running.
// Refusing rather than delaying keeps a flooding client from holding a
// goroutine in a sleep, and the client learns why. Used by the session's
// goroutine only.
type commandBucket struct {
	rate, burst float64
	tokens      float64
	last        time.Time
}

func newCommandBucket(rate float64, burst int, now time.Time) commandBucket {
	return commandBucket{rate: rate, burst: float64(burst), tokens: float64(burst), last: now}
}

// take reports whether a command may run at now, and if so spends a
// token. A clock that goes backwards adds nothing.
func (b *commandBucket) take(now time.Time) bool {
	if d := now.Sub(b.last); d > 0 {
		b.tokens = min(b.burst, b.tokens+d.Seconds()*b.rate)
		b.last = now
	}
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
