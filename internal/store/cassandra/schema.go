package cassandra

import (
	"context"
	"crypto/sha1"
	"fmt"
	"sort"
	"strings"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"
)

// bucketBits sizes the message and change log partitions: UIDs (and
// MODSEQs) u and v share a partition iff u>>bucketBits == v>>bucketBits, so
// a partition holds at most 16384 messages (a few MiB of metadata) and a
// 1,000,000-message mailbox spans 62 partitions.
const bucketBits = 14

// chunkSize is the size of a blob chunk; each chunk is its own partition,
// so the bytes of one body spread over the ring.
const chunkSize = 256 << 10

// indexShards is how many partitions the user and alias directories spread
// over; listings merge them in address order.
const indexShards = 16

// migrations are applied in order at Open. Every statement is idempotent
// (IF NOT EXISTS, or an ALTER TABLE ... ADD that runMigration skips when
// the column exists) and every table is created WITH ID derived from its
// keyspace and name, so that processes that migrate at the same moment
// create identical schema instead of conflicting table IDs (a concurrent
// CREATE TABLE with random IDs can leave the cluster in schema disagreement
// before Cassandra's transactional metadata). The version row is written
// after the schema agrees; a migration must therefore be safe to re-run.
var migrations = [][]string{
	1: {
		// addresses holds users and aliases in one namespace so that one
		// LWT (IF NOT EXISTS) claims an address for either.
		`CREATE TABLE IF NOT EXISTS addresses (
			address text PRIMARY KEY,
			target text,           -- alias: the user it delivers to; user: null
			password_hash text,
			quota bigint,
			status tinyint,
			created timestamp)`,
		// directory lists users (kind 'u') and aliases (kind 'a') in address
		// order, spread over indexShards partitions.
		`CREATE TABLE IF NOT EXISTS directory (
			kind text, shard int, address text, target text,
			PRIMARY KEY ((kind, shard), address))`,
		// uidvalidity survives the deletion of its user: a re-created
		// user's mailboxes never repeat a UIDVALIDITY (RFC 3501 2.3.1.1).
		`CREATE TABLE IF NOT EXISTS uidvalidity (
			address text PRIMARY KEY, last bigint)`,
		`CREATE TABLE IF NOT EXISTS mailbox_names (
			address text, name text, id blob,
			PRIMARY KEY (address, name))`,
		// mailboxes is the mailbox head; mutations are serialized by LWTs
		// on it (see the package comment). pending is the JSON operation
		// in progress; recent the IDs of the last operations begun.
		`CREATE TABLE IF NOT EXISTS mailboxes (
			id blob PRIMARY KEY,
			address text, name text, special_use text, subscribed boolean,
			uidvalidity bigint, uidnext bigint, modseq bigint,
			messages bigint, size bigint,
			pending blob, recent frozen<list<blob>>)`,
		`CREATE TABLE IF NOT EXISTS messages (
			mailbox blob, bucket int, uid bigint,
			modseq bigint, flags text, internal_date timestamp, size bigint,
			blob blob, meta blob,
			PRIMARY KEY ((mailbox, bucket), uid))`,
		// changes keeps the latest change of each UID, by MODSEQ bucket.
		`CREATE TABLE IF NOT EXISTS changes (
			mailbox blob, bucket int, modseq bigint, uid bigint, kind tinyint,
			PRIMARY KEY ((mailbox, bucket), modseq, uid))`,
		`CREATE TABLE IF NOT EXISTS blobs (
			id blob PRIMARY KEY, size bigint, chunks int, created timestamp)`,
		`CREATE TABLE IF NOT EXISTS blob_chunks (
			id blob, chunk int, data blob,
			PRIMARY KEY ((id, chunk)))`,
		// blob_refs: one row per message holding a blob; a blob goes when
		// its last row does. Rows, not counters, so retries never double
		// count.
		`CREATE TABLE IF NOT EXISTS blob_refs (
			id blob, mailbox blob, uid bigint,
			PRIMARY KEY (id, mailbox, uid))`,
		// pending_blobs marks blobs stored but not yet referenced.
		`CREATE TABLE IF NOT EXISTS pending_blobs (
			shard int, id blob, created timestamp,
			PRIMARY KEY (shard, id))`,
	},
	2: {
		// expunge_floor is store.Mailbox.ExpungeFloor: the change log rows
		// at or below it are deleted (ops.go, pruneChanges).
		`ALTER TABLE mailboxes ADD expunge_floor bigint`,
	},
	3: {
		// maildrop_leases holds the live POP3 maildrop leases (leases.go):
		// owner is the holding session's random ID, the row's TTL the end
		// of its term.
		`CREATE TABLE IF NOT EXISTS maildrop_leases (
			address text PRIMARY KEY, owner blob)`,
	},
	4: {
		// secrets holds store.Secrets (secrets.go): each row is written
		// once, by an LWT, and never changed.
		`CREATE TABLE IF NOT EXISTS secrets (
			name text PRIMARY KEY, value blob, created timestamp)`,
	},
	5: {
		// cluster_maps holds store.Ownership's map epochs (ownership.go),
		// one row per epoch in one partition, each inserted once by an
		// LWT and never changed; members is JSON.
		`CREATE TABLE IF NOT EXISTS cluster_maps (
			k int, epoch bigint, members blob, proposed timestamp,
			PRIMARY KEY (k, epoch))`,
		// node_leases holds one lease row per node, in one partition,
		// written with ordinary writes by its node only.
		`CREATE TABLE IF NOT EXISTS node_leases (
			k int, node text, adopted bigint, renewal bigint, released boolean,
			PRIMARY KEY (k, node))`,
	},
	6: {
		// The batch mode (ADR 0026). Numbered 4 on the branch that built it;
		// renumbered after main's 4 (secrets) and 5 (ownership): every
		// statement is idempotent, so a keyspace at 5 upgrades by running it.
		// keyspace_mode records, once, which of the engine's two ways of
		// writing mailboxes the keyspace holds (mode.go): "ordered" (the
		// LWT-ordered tables above) or "batches" (the tables below).
		`CREATE TABLE IF NOT EXISTS keyspace_mode (
			k int PRIMARY KEY, mode text, claimed timestamp)`,
		// The batch mode's tables (ADR 0026). bmailboxes is a mailbox:
		// its descriptive columns (address .. uidvalidity), written by the
		// mailbox calls at wall-clock time, and its head (epoch ..
		// expunge_floor), written only by user managers at epoch
		// timestamps (1<<62 | epoch<<32 | n).
		`CREATE TABLE IF NOT EXISTS bmailboxes (
			id blob PRIMARY KEY,
			address text, name text, special_use text, subscribed boolean, uidvalidity bigint,
			epoch bigint, uidnext bigint, modseq bigint, messages bigint, size bigint, expunge_floor bigint)`,
		// bmessages holds, per UID, the message row (modseq 0: what never
		// changes, and the flags it was added with at MODSEQ added) and
		// one version row per later flag change or expunge (modseq, kind).
		// A version row is an index: its state is the bchanges entry at
		// (modseq, uid), which the takeover tombstones fence.
		`CREATE TABLE IF NOT EXISTS bmessages (
			mailbox blob, bucket int, uid bigint, modseq bigint,
			kind tinyint, added bigint, flags text, internal_date timestamp, size bigint, blob blob, meta blob,
			PRIMARY KEY ((mailbox, bucket), uid, modseq))`,
		// bchanges is the change log and the versioned message state, by
		// MODSEQ bucket: section 0 holds each flag version (kind, flags)
		// until a newer version of its UID supersedes it; section 1 holds
		// expunges until the expunge floor passes them. Additions have no
		// entry: readers derive them from bmessages (batchadded.go);
		// keyspaces written before hold added entries in section 0, which
		// readers skip.
		`CREATE TABLE IF NOT EXISTS bchanges (
			mailbox blob, bucket int, section tinyint, modseq bigint, uid bigint,
			kind tinyint, flags text,
			PRIMARY KEY ((mailbox, bucket), section, modseq, uid))`,
		// Blobs written with a batch: a body of one chunk is kept in the
		// blob row itself (data), and the message that stored it (owner,
		// owner_uid) holds it without a blob_refs row.
		`ALTER TABLE blobs ADD data blob`,
		`ALTER TABLE blobs ADD owner blob`,
		`ALTER TABLE blobs ADD owner_uid bigint`,
	},
	7: {
		// Pending deliveries (store.PendingDeliveries, ADR 0034): the
		// records of one bucket in one partition, in the order they are
		// applied; pending_buckets lists the buckets that may hold some,
		// in one partition every node polls.
		`CREATE TABLE IF NOT EXISTS pending_deliveries (
			bucket int, at bigint, id blob,
			address text, mailbox blob, blob blob, size bigint, flags text, internal_date timestamp, meta blob,
			uid bigint,
			PRIMARY KEY (bucket, at, id))`,
		`CREATE TABLE IF NOT EXISTS pending_buckets (
			k int, bucket int,
			PRIMARY KEY (k, bucket))`,
	},
}

func createKeyspace(ctx context.Context, s *gocql.Session, keyspace string, repl map[string]string) error {
	keys := make([]string, 0, len(repl))
	for k := range repl {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("'%s': '%s'", cqlEscape(k), cqlEscape(repl[k])))
	}
	stmt := fmt.Sprintf("CREATE KEYSPACE IF NOT EXISTS %s WITH replication = {%s}", keyspace, strings.Join(parts, ", "))
	if err := s.Query(stmt).WithContext(ctx).Exec(); err != nil {
		return wrap("creating keyspace "+keyspace, err)
	}
	return wrap("schema agreement", s.AwaitSchemaAgreement(ctx))
}

func cqlEscape(s string) string { return strings.ReplaceAll(s, "'", "''") }

// tableID is the deterministic table ID of keyspace.table (a name-based
// UUID, version 5 layout).
func tableID(keyspace, table string) string {
	h := sha1.Sum([]byte("quill/" + keyspace + "." + table))
	h[6] = h[6]&0x0f | 0x50
	h[8] = h[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

// migrate brings the keyspace to the newest schema version.
func (e *Engine) migrate(ctx context.Context) error {
	ks := e.opts.Keyspace
	stmt := fmt.Sprintf(`CREATE TABLE IF NOT EXISTS schema_version (k int PRIMARY KEY, version int, applied timestamp) WITH ID = %s`,
		tableID(ks, "schema_version"))
	if err := e.s.Query(stmt).WithContext(ctx).Exec(); err != nil {
		return wrap("creating schema_version", err)
	}
	if err := e.s.AwaitSchemaAgreement(ctx); err != nil {
		return wrap("schema agreement", err)
	}
	for {
		var cur int
		err := e.serialRead(ctx, `SELECT version FROM schema_version WHERE k = 0`).Scan(&cur)
		for try := 0; err != nil && err != gocql.ErrNotFound && try < 30; try++ {
			// Another process's DDL may not have reached every replica yet
			// ("Unknown CF") even after the versions agreed: wait, retry.
			e.log.Info("schema not settled yet; retrying", "err", err)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(500 * time.Millisecond):
			}
			_ = e.s.AwaitSchemaAgreement(ctx)
			err = e.serialRead(ctx, `SELECT version FROM schema_version WHERE k = 0`).Scan(&cur)
		}
		if err != nil && err != gocql.ErrNotFound {
			return wrap("reading schema version", err)
		}
		if cur >= len(migrations)-1 {
			if cur > len(migrations)-1 {
				return fmt.Errorf("cassandra: keyspace %s has schema version %d, newer than this binary's %d", ks, cur, len(migrations)-1)
			}
			return nil
		}
		next := cur + 1
		for _, ddl := range migrations[next] {
			if err := e.runMigration(ctx, ddl); err != nil {
				return wrap(fmt.Sprintf("migration %d", next), err)
			}
		}
		if err := e.s.AwaitSchemaAgreement(ctx); err != nil {
			return wrap("schema agreement", err)
		}
		var q *gocql.Query
		if cur == 0 {
			q = e.cas(ctx, `INSERT INTO schema_version (k, version, applied) VALUES (0, ?, ?) IF NOT EXISTS`, next, time.Now())
		} else {
			q = e.cas(ctx, `UPDATE schema_version SET version = ?, applied = ? WHERE k = 0 IF version = ?`, next, time.Now(), cur)
		}
		if _, err := q.MapScanCAS(map[string]any{}); err != nil {
			return wrap("recording schema version", err)
		}
		e.log.Info("cassandra schema migrated", "keyspace", ks, "version", next)
	}
}

// runMigration runs one statement of a migration. CQL has no ALTER TABLE
// ... ADD IF NOT EXISTS, so an added column that exists already (a re-run,
// or another process migrating at the same moment) counts as added.
func (e *Engine) runMigration(ctx context.Context, ddl string) error {
	table, column, ok := addedColumn(ddl)
	if !ok {
		return e.s.Query(withTableID(e.opts.Keyspace, ddl)).WithContext(ctx).Exec()
	}
	exists := func() (bool, error) {
		var name string
		err := e.s.Query(`SELECT column_name FROM system_schema.columns WHERE keyspace_name = ? AND table_name = ? AND column_name = ?`,
			e.opts.Keyspace, table, column).WithContext(ctx).Consistency(gocql.One).Scan(&name)
		if err == gocql.ErrNotFound {
			return false, nil
		}
		return err == nil, err
	}
	if ok, err := exists(); ok || err != nil {
		return err
	}
	err := e.s.Query(ddl).WithContext(ctx).Exec()
	if err != nil {
		if ok, _ := exists(); ok {
			return nil
		}
	}
	return err
}

// addedColumn parses "ALTER TABLE t ADD c type".
func addedColumn(ddl string) (table, column string, ok bool) {
	f := strings.Fields(ddl)
	if len(f) != 6 || !strings.EqualFold(f[0], "ALTER") || !strings.EqualFold(f[1], "TABLE") || !strings.EqualFold(f[3], "ADD") {
		return "", "", false
	}
	return f[2], f[4], true
}

// withTableID appends WITH ID = ... to a CREATE TABLE statement.
func withTableID(keyspace, ddl string) string {
	const prefix = "CREATE TABLE IF NOT EXISTS "
	if !strings.HasPrefix(ddl, prefix) {
		return ddl
	}
	name, _, _ := strings.Cut(ddl[len(prefix):], " ")
	return ddl + " WITH ID = " + tableID(keyspace, strings.TrimSpace(name))
}
