package cluster

// Load is what a node reports of its own load (internal/load measures it).
type Load struct {
	// Sessions is the number of client connections open on the node's
	// protocol listeners (SMTP, submission, LMTP, POP3, IMAP).
	Sessions int
	// CPU is the process's CPU time (user and system) over the last few
	// seconds, divided by that span and by the machine's CPUs: 0 is idle,
	// 1 every CPU busy.
	CPU float64
	// Overloaded: the node refuses new client connections
	// (limits.overload_latency).
	Overloaded bool
}
