package bodylog

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"

	"github.com/cockroachdb/pebble/v2"
)

// Replay applies to db, in order, every record after the position from
// (the persisted position; zero for none), then starts a new segment to
// write to. Segments before from's are marked flushed.
func (l *Log) Replay(db *pebble.DB, from Pos) error {
	ids := l.ids()
	end := int64(0) // valid length of the last segment
	for i, id := range ids {
		s := l.segs[id]
		last := i == len(ids)-1
		if id < from.Seg {
			// Already applied. Its header says whether it may be reused;
			// a reused file may be longer than the segment, whose length
			// its successor's header gives.
			s.flushed = true
			_, s.seed, _ = readSegHeader(s)
			if !last && ids[i+1] == id+1 {
				if prev, ok := l.prevEnd(l.segs[id+1]); ok {
					s.size = prev
				}
			}
			continue
		}
		limit, lenient := s.size, last
		if !last {
			if ids[i+1] != id+1 {
				// The next segment was deleted, which the cleaner does only
				// once Pebble's tables hold all its records, and so all of
				// this one's: there is nothing here after from to apply.
				if id != from.Seg {
					return fmt.Errorf("embedded: log segment %s is missing: %w", SegName(id+1), ErrCorrupt)
				}
				continue
			}
			if prev, ok := l.prevEnd(l.segs[id+1]); ok {
				limit = prev
			} else {
				// The next segment's header is torn, so it never held a
				// record (its own replay refuses it if it did) and this
				// one was the last.
				lenient = true
			}
		}
		var err error
		end, err = l.replaySegment(db, s, limit, lenient, from)
		if err != nil {
			return err
		}
		s.size = end
	}
	next := uint32(1)
	if len(ids) > 0 {
		next = ids[len(ids)-1] + 1
	}
	return l.rotate(next, end)
}

// prevEnd reads the valid length of the segment before s from s's header;
// false if the header is torn.
func (l *Log) prevEnd(s *Segment) (int64, bool) {
	prev, _, ok := readSegHeader(s)
	return prev, ok
}

// readSegHeader reads and checks s's header, returning the previous
// segment's valid length and the seed of s's checksums; false if the header
// is torn or is what the file held before it was reused.
func readSegHeader(s *Segment) (prevEnd int64, seed uint32, ok bool) {
	var h [HeaderLen]byte
	if n, _ := s.f.ReadAt(h[:], 0); n < HeaderLen {
		return 0, 0, false
	}
	switch string(h[:4]) {
	case segMagic:
		seed = logSeed(s.id)
	case segMagicV1:
	default:
		return 0, 0, false
	}
	if crc32.Update(seed, crcTable, h[:12]) != binary.LittleEndian.Uint32(h[12:16]) {
		return 0, 0, false
	}
	return int64(binary.LittleEndian.Uint64(h[4:12])), seed, true
}

// replaySegment applies the records of s up to limit that come after from,
// and returns the segment's valid length. In the last segment (lenient) a
// bad record is a torn tail and ends it; elsewhere records must fill limit
// exactly.
func (l *Log) replaySegment(db *pebble.DB, s *Segment, limit int64, lenient bool, from Pos) (int64, error) {
	corrupt := func(at int64, what string) (int64, error) {
		if lenient {
			return at, nil
		}
		return 0, fmt.Errorf("embedded: log segment %s at %d: %s: %w", SegName(s.id), at, what, ErrCorrupt)
	}
	if limit <= HeaderLen && !lenient {
		return limit, nil // its successor began before any record was written
	}
	_, seed, ok := readSegHeader(s)
	if !ok {
		// rotate syncs a header before the segment's first record is
		// written, so a crash can tear the header only of a segment that
		// never held a record. One whose first record checks out was
		// damaged since: corruption, even in the last segment.
		if firstRecordValid(s) {
			return 0, fmt.Errorf("embedded: log segment %s: bad header before valid records: %w", SegName(s.id), ErrCorrupt)
		}
		return corrupt(0, "bad header")
	}
	s.seed = seed
	var payload []byte
	pos := int64(HeaderLen)
	for pos < limit {
		n, sum, bad := readRecordHeader(s, pos, limit)
		if bad != "" {
			return corrupt(pos, bad)
		}
		applied := s.id == from.Seg && pos <= from.Off
		if !applied {
			if int64(cap(payload)) < n {
				payload = make([]byte, n)
			}
			payload = payload[:n]
			if got, _ := s.f.ReadAt(payload, pos+8); int64(got) < n {
				return corrupt(pos, "short record")
			}
			if crc32.Update(seed, crcTable, payload) != sum {
				return corrupt(pos, "checksum mismatch")
			}
			bodies := int64(binary.LittleEndian.Uint32(payload[:4]))
			if bodies > n-4 {
				return corrupt(pos, "bad bodies length")
			}
			b := db.NewBatch()
			if err := b.SetRepr(payload[4+bodies:]); err != nil {
				b.Close()
				return corrupt(pos, err.Error())
			}
			err := db.Apply(b, pebble.NoSync)
			b.Close()
			if err != nil {
				return 0, fmt.Errorf("embedded: replaying log segment %s at %d: %w", SegName(s.id), pos, err)
			}
		}
		pos += 8 + n
	}
	return pos, nil
}

// readRecordHeader reads the header of the record at pos in s, which must
// end by limit, and returns its payload's length and checksum, or what is
// wrong with it.
func readRecordHeader(s *Segment, pos, limit int64) (n int64, sum uint32, bad string) {
	var rh [8]byte
	if got, _ := s.f.ReadAt(rh[:], pos); got < len(rh) {
		return 0, 0, "short record header"
	}
	n = int64(binary.LittleEndian.Uint32(rh[:4]))
	if n < 4 || n > maxRecord || pos+8+n > limit {
		return 0, 0, "bad record length"
	}
	return n, binary.LittleEndian.Uint32(rh[4:]), ""
}

// firstRecordValid reports whether s holds a whole record with a valid
// checksum right after its header, under either format's seed. A reused
// file's old records fail both: their checksums cover another segment's id,
// and only segments of the current format are reused.
func firstRecordValid(s *Segment) bool {
	n, sum, bad := readRecordHeader(s, HeaderLen, s.size)
	if bad != "" {
		return false
	}
	payload := make([]byte, n)
	if got, _ := s.f.ReadAt(payload, HeaderLen+8); int64(got) < n {
		return false
	}
	return crc32.Update(logSeed(s.id), crcTable, payload) == sum || crc32.Update(0, crcTable, payload) == sum
}
