// Package usermap is Quill's user map: users hash into a fixed number of
// buckets, and a deterministic function of the membership view assigns each
// bucket to one node, the user manager of the bucket's users
// (ARCHITECTURE.md, "The user map and the user manager"). Any node that holds
// the same view computes the same map, so "who manages user U" is answered
// locally, without asking anyone.
//
// The package is pure: no I/O, no clock, no Quill imports. Membership, load
// reports, leases and handoff are built on top of it elsewhere.
//
// Invariants of a Map built by New:
//   - every bucket has exactly one owner, a member with Weight > 0 that is
//     not Draining;
//   - an eligible member with weight w out of a total W owns exactly its
//     quota of buckets, floor(Buckets*w/W) or one more (largest remainder);
//   - the map is a function of the set of members: the order in which they
//     are listed does not matter;
//   - all arithmetic is on integers, so every platform and Go version
//     computes the same map from the same view.
//
// The assignment is the stable matching of buckets to nodes under those
// quotas, with both sides ranking by one rendezvous score per (bucket, node)
// pair; see assign.go and docs/adr/0015-user-map.md.
package usermap

// Buckets is the number of buckets, a cluster-wide constant. 4096 gives 128
// buckets per node at 32 nodes (shedding load in steps under 1%) and keeps
// 10 buckets per node up to about 400 nodes, while a map of 16 nodes still
// recomputes in under a millisecond (BenchmarkAssign) and fits in 8 KiB as
// one uint16 per bucket. 1024 would leave too few buckets per node for
// shedding load at 32 nodes and beyond. Changing it moves nearly every user:
// it is part of the cluster's contract, like the hash below.
const Buckets = 4096

// bucketBits is log2(Buckets): Bucket takes the top bits of the hash.
const bucketBits = 12

// Bucket returns the bucket of a user. user is the user's canonical name, as
// the directory stores it (mail.Address.Normalized for an address; aliases
// are resolved before). Bucket folds ASCII letters to lower case itself, so
// a caller that forgot to fold ASCII still lands in the right bucket; it
// leaves other bytes alone, because Unicode case tables change between
// versions and the hash must not.
//
// The hash is FNV-1a 64 over the bytes followed by MurmurHash3's 64-bit
// finalizer (fmix64), whose top 12 bits are the bucket. FNV-1a alone would
// not do: the low k bits of its state depend only on the low k bits of the
// previous state, so its low bits mix poorly. Both functions are fixed
// specifications; TestBucketIsStable pins their output, because a change
// would move every user.
func Bucket(user string) uint32 {
	return uint32(fmix64(fnv1aFold(user)) >> (64 - bucketBits))
}

const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

// fnv1aFold is FNV-1a 64 over s with ASCII upper case folded to lower case.
func fnv1aFold(s string) uint64 {
	h := uint64(fnvOffset64)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		h ^= uint64(c)
		h *= fnvPrime64
	}
	return h
}

// fnv1a is FNV-1a 64 over s, bytes as given (node IDs are not folded).
func fnv1a(s string) uint64 {
	h := uint64(fnvOffset64)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime64
	}
	return h
}

// fmix64 is MurmurHash3's 64-bit finalizer: a bijection in which every input
// bit affects every output bit.
func fmix64(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	k *= 0xc4ceb9fe1a85ec53
	k ^= k >> 33
	return k
}
