// Package pop3 is Quill's POP3 front end: the command parser, the
// AUTHORIZATION / TRANSACTION / UPDATE state machine of RFC 1939, the
// extensions of RFC 2449 (CAPA, response codes, PIPELINING), STLS (RFC 2595)
// and SASL AUTH (RFC 5034), and a Server that accepts connections in the
// style of net/http.
//
// The package never touches storage: it reaches users and messages only
// through the Backend and Maildrop interfaces defined here, which the
// composition root implements over the store.
package pop3
