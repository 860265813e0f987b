// Package imap is Quill's IMAP front end (RFC 3501 IMAP4rev1 with the
// extensions listed in Capabilities): the command decoder and response
// encoder, the per-connection state machine (not authenticated,
// authenticated, selected, logout), one file per command as in
// emersion/go-imap's imapserver, and a Server that accepts connections in
// the style of net/http on top of internal/textconn.
//
// The package never touches storage. It reaches users and mailboxes
// through Backend, Mailboxes and View, defined here; the selected
// mailbox's sequence numbers and pending changes live in the View
// (implemented by internal/mailbox), not in the protocol code. See
// docs/adr/0008-imap.md.
package imap
