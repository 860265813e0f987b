package auth

import "errors"

// Errors returned by Authenticate. Protocol front ends map them to replies;
// the detail never reaches the client.
var (
	// ErrInvalidCredentials: unknown user or wrong password (indistinguishable
	// on purpose).
	ErrInvalidCredentials = errors.New("auth: invalid credentials")
	// ErrThrottled: too many recent failures from this address or for this
	// user; the client should retry later.
	ErrThrottled = errors.New("auth: too many failures, try later")
	// ErrBusy: too many password checks are already running; temporary,
	// the client should retry shortly. Nothing was counted against it.
	ErrBusy = errors.New("auth: too many logins in progress, try later")
	// ErrDisabled: the account exists but may not log in.
	ErrDisabled = errors.New("auth: account disabled")
)
