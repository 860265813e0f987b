package embedded

import (
	"encoding/binary"
	"math"
	"time"

	"quill/internal/store"
	"quill/internal/store/embedded/bodylog"
)

// Key layout. Every key starts with a one-byte table prefix; integers in keys
// are big-endian so that byte order is numeric order.
//
//	'u' user                          -> user record
//	'a' alias                         -> target user
//	'A' user 0x00 alias               -> nil (reverse index for DeleteUser)
//	'n' user 0x00 name                -> mailbox ID
//	'm' mailboxID                     -> mailbox record
//	'x' mailboxID uid(4)              -> message record
//	'c' mailboxID modseq(8) uid(4)    -> change kind (latest change per UID;
//	                                     one entry, at its lowest UID, for
//	                                     the UIDs of one expunge, see
//	                                     encodeExpunged; expunges at or
//	                                     below the mailbox's ExpungeFloor
//	                                     are pruned)
//	'B' blobID                        -> blob record (size, refs, and chunks
//	                                     or the body's place in the log)
//	'b' blobID chunk(4)               -> chunk bytes
//	'g' segment(4) blobID             -> size: the log index of a frozen
//	                                     segment (package bodylog, "Space")
//	'L'                               -> position of the log record that wrote
//	                                     this batch (bodylog.Pos)
//	'p' blobID                        -> creation time: blob not yet referenced
//	'q' user                          -> usage record
//	'v' user                          -> last UIDVALIDITY handed out
//	'S' name                          -> secret (store.Secrets), never
//	                                     changed once written
//	'V'                               -> schema version
const (
	tUser     = 'u'
	tAlias    = 'a'
	tAliasOf  = 'A'
	tName     = 'n'
	tMailbox  = 'm'
	tMessage  = 'x'
	tChange   = 'c'
	tBlob     = 'B'
	tChunk    = 'b'
	tLogged   = 'g'
	tLogPos   = 'L'
	tPending  = 'p'
	tUsage    = 'q'
	tValidity = 'v'
	tSecret   = 'S'
	tVersion  = 'V'
	// schemaLevel 2 stores bodies in the log; level 1 stored them only in
	// chunks, which later levels still read. Level 3 keeps the log index
	// of young segments in memory only, where level 2 kept every
	// segment's in Pebble; a level-2 store is a level-3 store whose
	// segments are all frozen. Opening a store of a lower level upgrades
	// it in place; a binary of a lower level refuses a level-3 store,
	// whose young segments' bodies it would take for garbage.
	schemaLevel = 3
)

func key(table byte, parts ...[]byte) []byte {
	n := 1
	for _, p := range parts {
		n += len(p)
	}
	k := make([]byte, 1, n)
	k[0] = table
	for _, p := range parts {
		k = append(k, p...)
	}
	return k
}

func userKey(u string) []byte          { return key(tUser, []byte(u)) }
func aliasKey(a string) []byte         { return key(tAlias, []byte(a)) }
func aliasOfKey(u, a string) []byte    { return key(tAliasOf, []byte(u), []byte{0}, []byte(a)) }
func aliasOfPrefix(u string) []byte    { return key(tAliasOf, []byte(u), []byte{0}) }
func nameKey(u, name string) []byte    { return key(tName, []byte(u), []byte{0}, []byte(name)) }
func namePrefix(u string) []byte       { return key(tName, []byte(u), []byte{0}) }
func mailboxKey(id store.ID) []byte    { return key(tMailbox, id[:]) }
func messagePrefix(id store.ID) []byte { return key(tMessage, id[:]) }
func changePrefix(id store.ID) []byte  { return key(tChange, id[:]) }
func blobKey(id store.ID) []byte       { return key(tBlob, id[:]) }
func chunkPrefix(id store.ID) []byte   { return key(tChunk, id[:]) }
func pendingKey(id store.ID) []byte    { return key(tPending, id[:]) }
func loggedPrefix(seg uint32) []byte   { return binary.BigEndian.AppendUint32([]byte{tLogged}, seg) }
func usageKey(u string) []byte         { return key(tUsage, []byte(u)) }
func validityKey(u string) []byte      { return key(tValidity, []byte(u)) }

// keyIn returns the key of table and s in buf's array when it fits, for a
// lookup that keeps no reference to it (getCommitted): with buf an array
// on the caller's stack, building the key allocates nothing.
func keyIn(buf []byte, table byte, s string) []byte {
	return append(append(buf[:0], table), s...)
}

func messageKey(id store.ID, uid uint32) []byte {
	return binary.BigEndian.AppendUint32(key(tMessage, id[:]), uid)
}

func changeKey(id store.ID, modseq uint64, uid uint32) []byte {
	k := binary.BigEndian.AppendUint64(key(tChange, id[:]), modseq)
	return binary.BigEndian.AppendUint32(k, uid)
}

func loggedKey(seg uint32, id store.ID) []byte {
	k := binary.BigEndian.AppendUint32(append(make([]byte, 0, 1+4+len(id)), tLogged), seg)
	return append(k, id[:]...)
}

func chunkKey(id store.ID, n uint32) []byte {
	return binary.BigEndian.AppendUint32(key(tChunk, id[:]), n)
}

// prefixEnd returns the smallest key greater than every key with prefix p.
func prefixEnd(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		end[i]++
		if end[i] != 0 {
			return end[:i+1]
		}
	}
	return nil
}

// errCorrupt marks a record, key or log that fails its checks: the body
// log's error, so that one errors.Is finds either.
var errCorrupt = bodylog.ErrCorrupt

// enc appends the fields of a record; dec reads them back, remembering the
// first error so that decoders read straight through.
type enc []byte

func (e *enc) uvarint(v uint64) { *e = binary.AppendUvarint(*e, v) }
func (e *enc) varint(v int64)   { *e = binary.AppendVarint(*e, v) }
func (e *enc) bytes(b []byte)   { e.uvarint(uint64(len(b))); *e = append(*e, b...) }
func (e *enc) str(s string)     { e.uvarint(uint64(len(s))); *e = append(*e, s...) }
func (e *enc) id(id store.ID)   { *e = append(*e, id[:]...) }
func (e *enc) time(t time.Time) { e.varint(t.UnixNano()) }
func (e *enc) boolean(b bool) {
	if b {
		*e = append(*e, 1)
	} else {
		*e = append(*e, 0)
	}
}

type dec struct {
	b   []byte
	err error
}

func (d *dec) fail() {
	if d.err == nil {
		d.err = errCorrupt
	}
	d.b = nil
}

func (d *dec) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *dec) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *dec) bytes() []byte {
	n := d.uvarint()
	if uint64(len(d.b)) < n {
		d.fail()
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *dec) str() string { return string(d.bytes()) }

func (d *dec) id() store.ID {
	var id store.ID
	if len(d.b) < len(id) {
		d.fail()
		return id
	}
	copy(id[:], d.b)
	d.b = d.b[len(id):]
	return id
}

func (d *dec) time() time.Time { return time.Unix(0, d.varint()).UTC() }

func (d *dec) boolean() bool {
	if len(d.b) < 1 {
		d.fail()
		return false
	}
	v := d.b[0] != 0
	d.b = d.b[1:]
	return v
}

func encodeUser(u store.User) []byte {
	var e enc
	e.str(u.Address)
	e.str(u.PasswordHash)
	e.varint(u.QuotaBytes)
	e.uvarint(uint64(u.Status))
	e.time(u.Created)
	return e
}

func decodeUser(b []byte) (store.User, error) {
	d := dec{b: b}
	u := store.User{
		Address:      d.str(),
		PasswordHash: d.str(),
		QuotaBytes:   d.varint(),
		Status:       store.UserStatus(d.uvarint()),
		Created:      d.time(),
	}
	return u, d.err
}

// decodeQuota returns the QuotaBytes of an encoded user record without
// copying its strings: every delivery checks it.
func decodeQuota(b []byte) (int64, error) {
	d := dec{b: b}
	d.bytes() // Address
	d.bytes() // PasswordHash
	q := d.varint()
	return q, d.err
}

func encodeMailbox(m store.Mailbox) []byte {
	var e enc
	e.id(m.ID)
	e.str(m.User)
	e.str(m.Name)
	e.str(m.SpecialUse)
	e.boolean(m.Subscribed)
	e.uvarint(uint64(m.UIDValidity))
	e.uvarint(uint64(m.UIDNext))
	e.uvarint(m.HighestModSeq)
	e.uvarint(uint64(m.Messages))
	e.varint(m.Size)
	e.uvarint(m.ExpungeFloor)
	return e
}

func decodeMailbox(b []byte) (store.Mailbox, error) {
	d := dec{b: b}
	m := store.Mailbox{
		ID:            d.id(),
		User:          d.str(),
		Name:          d.str(),
		SpecialUse:    d.str(),
		Subscribed:    d.boolean(),
		UIDValidity:   uint32(d.uvarint()),
		UIDNext:       uint32(d.uvarint()),
		HighestModSeq: d.uvarint(),
		Messages:      uint32(d.uvarint()),
		Size:          d.varint(),
	}
	if len(d.b) > 0 {
		// Records written before expunges were pruned end here.
		m.ExpungeFloor = d.uvarint()
	}
	return m, d.err
}

// encodeMessage encodes everything but the UID, which is in the key.
func encodeMessage(m store.Message) []byte {
	e := make(enc, 0, 48+len(m.Meta))
	e.uvarint(m.ModSeq)
	e.time(m.InternalDate)
	e.varint(m.Size)
	e.id(m.Blob)
	e.uvarint(uint64(len(m.Flags)))
	for _, f := range m.Flags {
		e.str(f)
	}
	e.bytes(m.Meta)
	return e
}

func decodeMessage(uid uint32, b []byte) (store.Message, error) {
	d := dec{b: b}
	m := store.Message{UID: uid, ModSeq: d.uvarint(), InternalDate: d.time(), Size: d.varint(), Blob: d.id()}
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail()
	}
	if n > 0 && d.err == nil {
		m.Flags = make([]string, n)
		for i := range m.Flags {
			m.Flags[i] = d.str()
		}
	}
	if meta := d.bytes(); len(meta) > 0 {
		m.Meta = append([]byte(nil), meta...)
	}
	return m, d.err
}

// maxExpungedPerEntry bounds the UIDs one change log entry records, so that
// what an entry decodes to is bounded whatever its bytes say; an expunge of
// more messages writes several entries at its MODSEQ.
const maxExpungedPerEntry = 4096

// encodeExpunged is the value of the change log entry that records the
// expunge of uids at the key's MODSEQ: uids ascending, distinct, at most
// maxExpungedPerEntry, the first being the key's UID. It is the kind, the
// first run of consecutive UIDs as its length - 1, then each further run
// as its distance from the previous one's end - 2 and its length - 1, all
// uvarints. One UID is the kind alone: the form of every change entry
// before an expunge's UIDs shared one, which decodeChanges reads the same.
//
// Under POP3's retrieve-and-delete one entry per session instead of one per
// message keeps the change log, and each compaction that rewrites it, about
// a message per session smaller.
func encodeExpunged(uids []uint32) []byte {
	e := enc{byte(store.ChangeExpunged)}
	if len(uids) == 1 {
		return e
	}
	start := 0
	for i := 1; i <= len(uids); i++ {
		if i < len(uids) && uids[i] == uids[i-1]+1 {
			continue
		}
		if start > 0 {
			e.uvarint(uint64(uids[start] - uids[start-1] - 2))
		}
		e.uvarint(uint64(i - 1 - start))
		start = i
	}
	return e
}

// decodeChanges appends the changes that the change log entry for (modseq,
// uid) with value v records: one, or an expunge's run-length encoded UIDs
// (encodeExpunged).
func decodeChanges(out []store.Change, modseq uint64, uid uint32, v []byte) ([]store.Change, error) {
	if len(v) == 0 {
		return out, errCorrupt
	}
	kind := store.ChangeKind(v[0])
	if len(v) == 1 {
		return append(out, store.Change{ModSeq: modseq, UID: uid, Kind: kind}), nil
	}
	if kind != store.ChangeExpunged {
		return out, errCorrupt
	}
	d := dec{b: v[1:]}
	first, n := uint64(uid), uint64(0)
	for run := 0; len(d.b) > 0; run++ {
		if run > 0 {
			gap := d.uvarint()
			if gap > math.MaxUint32 {
				return out, errCorrupt
			}
			first += gap + 2
		}
		length := d.uvarint() + 1
		if d.err != nil || length > maxExpungedPerEntry-n || first+length-1 > math.MaxUint32 {
			return out, errCorrupt
		}
		for u := first; u < first+length; u++ {
			out = append(out, store.Change{ModSeq: modseq, UID: uint32(u), Kind: kind})
		}
		n += length
		first += length - 1
	}
	return out, nil
}

// blobRecord is the 'B' record: a blob's size, the number of messages
// referencing it and where its bytes are: at Off in log segment Seg, or,
// when Seg is 0, in Chunks chunks.
type blobRecord struct {
	Size   int64
	Chunks uint32
	Refs   int64
	Seg    uint32
	Off    int64
}

func encodeBlob(r blobRecord) []byte {
	var e enc
	e.varint(r.Size)
	e.uvarint(uint64(r.Chunks))
	e.varint(r.Refs)
	if r.Seg != 0 {
		e.uvarint(uint64(r.Seg))
		e.varint(r.Off)
	}
	return e
}

func decodeBlob(b []byte) (blobRecord, error) {
	d := dec{b: b}
	r := blobRecord{Size: d.varint(), Chunks: uint32(d.uvarint()), Refs: d.varint()}
	if len(d.b) > 0 {
		r.Seg, r.Off = uint32(d.uvarint()), d.varint()
	}
	return r, d.err
}

func encodeUsage(u store.Usage) []byte {
	var e enc
	e.varint(u.Bytes)
	e.varint(u.Messages)
	return e
}

func decodeUsage(b []byte) (store.Usage, error) {
	d := dec{b: b}
	u := store.Usage{Bytes: d.varint(), Messages: d.varint()}
	return u, d.err
}
