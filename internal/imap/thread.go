package imap

import (
	"cmp"
	"context"
	"slices"
	"strconv"
	"strings"
)

// THREAD (RFC 5256 section 3) with the ORDEREDSUBJECT and REFERENCES
// algorithms, over the same keys as SORT (sortItem), so threading reads
// no body when summaries are stored.

// threadNode is a container of the REFERENCES algorithm: a message, or a
// dummy (item nil) standing for a message that is referenced but absent.
type threadNode struct {
	item     *sortItem
	parent   *threadNode
	children []*threadNode
}

// cmdThread: RFC 5256 section 3, THREAD and UID THREAD.
func (s *session) cmdThread(ctx context.Context, d *decoder, c *command) (string, error) {
	if err := d.sp(); err != nil {
		return "", err
	}
	alg, err := d.atom("")
	if err != nil {
		return "", err
	}
	alg = strings.ToUpper(alg)
	if alg != "ORDEREDSUBJECT" && alg != "REFERENCES" {
		return "", syntaxErr("unknown threading algorithm")
	}
	items, _, err := s.sortCandidates(ctx, d)
	if err != nil {
		return "", err
	}
	var roots []*threadNode
	if alg == "ORDEREDSUBJECT" {
		roots = threadOrderedSubject(items)
	} else {
		roots = threadReferences(items)
	}
	var b []byte
	b = append(b, "* THREAD"...)
	if len(roots) > 0 {
		// thread-data = "THREAD" [SP 1*thread-list] (RFC 5256 section 4).
		b = append(b, ' ')
	}
	for _, r := range roots {
		b = appendThread(b, r, c.uid)
	}
	s.enc.bytes(b).crlf()
	return c.name + " completed", nil
}

// threadOrderedSubject: RFC 5256 section 3, ORDEREDSUBJECT. Messages with
// the same base subject form one thread, the first by sent date its
// parent and the others its children; threads are ordered by the sent date
// of their first message.
func threadOrderedSubject(items []sortItem) []*threadNode {
	order := make([]*sortItem, len(items))
	for i := range items {
		order[i] = &items[i]
	}
	slices.SortStableFunc(order, func(a, b *sortItem) int {
		if r := strings.Compare(a.subject, b.subject); r != 0 {
			return r
		}
		return compareSent(a, b)
	})
	var roots []*threadNode
	var cur *threadNode
	for _, it := range order {
		if cur != nil && cur.item.subject == it.subject {
			cur.children = append(cur.children, &threadNode{item: it, parent: cur})
			continue
		}
		cur = &threadNode{item: it}
		roots = append(roots, cur)
	}
	slices.SortStableFunc(roots, compareNodes)
	return roots
}

// compareSent orders by sent date, then by mailbox order (RFC 5256
// section 2.2 and the tie rule of section 3).
func compareSent(a, b *sortItem) int {
	if r := cmp.Compare(a.sent, b.sent); r != 0 {
		return r
	}
	return cmp.Compare(a.m.Seq, b.m.Seq)
}

// first is the message that dates a node: itself, or a dummy's first
// child (after sorting).
func (n *threadNode) first() *sortItem {
	for n.item == nil {
		n = n.children[0]
	}
	return n.item
}

func compareNodes(a, b *threadNode) int { return compareSent(a.first(), b.first()) }

// threadReferences: RFC 5256 section 3, REFERENCES, steps 1 to 7.
func threadReferences(items []sortItem) []*threadNode {
	// (1) Containers by message id, linked by References (or the first
	// In-Reply-To id). A message without an id, or with one taken by an
	// earlier message, gets a container of its own.
	byID := make(map[string]*threadNode, len(items))
	var all []*threadNode
	get := func(id string) *threadNode {
		n := byID[id]
		if n == nil {
			n = &threadNode{}
			byID[id] = n
			all = append(all, n)
		}
		return n
	}
	for i := range items {
		it := &items[i]
		var c *threadNode
		if it.msgID != "" && (byID[it.msgID] == nil || byID[it.msgID].item == nil) {
			c = get(it.msgID)
		} else {
			c = &threadNode{}
			all = append(all, c)
		}
		c.item = it
		var prev *threadNode
		for _, ref := range it.parents {
			r := get(ref)
			// (1)(A): link each reference to the one before it, unless
			// it already has a parent or the link would make a loop.
			if prev != nil && r.parent == nil && !r.ancestorOf(prev) {
				r.setParent(prev)
			}
			prev = r
		}
		// (1)(B): the last reference is the message's parent, whatever
		// parent it had, unless that would make a loop.
		if c.parent != nil {
			c.setParent(nil)
		}
		if prev != nil && !c.ancestorOf(prev) {
			c.setParent(prev)
		}
	}
	// (2) The root set, (3) without the id table.
	var roots []*threadNode
	for _, n := range all {
		if n.parent == nil {
			roots = append(roots, n)
		}
	}
	// (4) Prune dummies; (5) sort.
	roots = prune(roots, true)
	sortTree(roots)
	// (6) Group the root set by base subject.
	bySubject := make(map[string]*threadNode)
	for _, n := range roots {
		it := n.first()
		if it.subject == "" {
			continue
		}
		old := bySubject[it.subject]
		if old == nil || (n.item == nil && old.item != nil) ||
			(old.first().isReplyOrForward && !it.isReplyOrForward) {
			bySubject[it.subject] = n
		}
	}
	removed := make(map[*threadNode]bool)
	for _, n := range roots {
		if removed[n] {
			continue
		}
		it := n.first()
		old := bySubject[it.subject]
		if it.subject == "" || old == n {
			continue
		}
		switch {
		case old.item == nil && n.item == nil:
			for _, ch := range n.children {
				ch.parent = old
			}
			old.children = append(old.children, n.children...)
			removed[n] = true
		case old.item == nil:
			old.children = append(old.children, n)
			n.parent = old
			removed[n] = true
		case n.item == nil:
			n.children = append(n.children, old)
			old.parent = n
			removed[old] = true
			bySubject[it.subject] = n
		case !old.item.isReplyOrForward && n.item.isReplyOrForward:
			old.children = append(old.children, n)
			n.parent = old
			removed[n] = true
		case old.item.isReplyOrForward && !n.item.isReplyOrForward:
			n.children = append(n.children, old)
			old.parent = n
			removed[old] = true
			bySubject[it.subject] = n
		default:
			// Both replies or neither: siblings under a new dummy, in
			// the table container's place.
			dummy := &threadNode{children: []*threadNode{old, n}}
			old.parent, n.parent = dummy, dummy
			removed[n] = true
			for j := range roots {
				if roots[j] == old {
					roots[j] = dummy
				}
			}
			bySubject[it.subject] = dummy
		}
	}
	roots = slices.DeleteFunc(roots, func(n *threadNode) bool { return removed[n] })
	// (7) Sort again.
	sortTree(roots)
	return roots
}

// ancestorOf reports whether n is d or an ancestor of d.
func (n *threadNode) ancestorOf(d *threadNode) bool {
	for ; d != nil; d = d.parent {
		if d == n {
			return true
		}
	}
	return false
}

// setParent moves n under p (nil: to the root set).
func (n *threadNode) setParent(p *threadNode) {
	if old := n.parent; old != nil {
		old.children = slices.DeleteFunc(old.children, func(c *threadNode) bool { return c == n })
	}
	n.parent = p
	if p != nil {
		p.children = append(p.children, n)
	}
}

// prune is step (4): dummies without children go; a dummy's children
// take its place, except at the root when there are several of them.
func prune(nodes []*threadNode, atRoot bool) []*threadNode {
	out := nodes[:0:0]
	for _, n := range nodes {
		n.children = prune(n.children, false)
		if n.item == nil {
			if len(n.children) == 0 {
				continue
			}
			if !atRoot || len(n.children) == 1 {
				for _, ch := range n.children {
					ch.parent = n.parent
				}
				out = append(out, n.children...)
				continue
			}
		}
		out = append(out, n)
	}
	return out
}

// sortTree is step (5): every set of siblings by sent date, children
// first so that a dummy is dated by its first child.
func sortTree(nodes []*threadNode) {
	for _, n := range nodes {
		sortTree(n.children)
	}
	slices.SortStableFunc(nodes, compareNodes)
}

// appendThread renders one thread (RFC 5256 section 4, thread-list): a
// chain of only children is a list of numbers, several children are
// nested thread-lists.
func appendThread(b []byte, n *threadNode, uid bool) []byte {
	b = append(b, '(')
	for {
		if n.item != nil {
			if uid {
				b = strconv.AppendUint(b, uint64(n.item.m.UID), 10)
			} else {
				b = strconv.AppendUint(b, uint64(n.item.m.Seq), 10)
			}
		}
		if len(n.children) != 1 || n.item == nil {
			break
		}
		b = append(b, ' ')
		n = n.children[0]
	}
	if len(n.children) > 1 || (n.item == nil && len(n.children) > 0) {
		if n.item != nil {
			b = append(b, ' ')
		}
		for _, ch := range n.children {
			b = appendThread(b, ch, uid)
		}
	}
	return append(b, ')')
}
