package imap

import (
	"context"
	"sort"
	"strings"

	"quill/internal/mailbox"
)

// cmdList: RFC 3501 section 6.3.8, with the CHILDREN (RFC 3348) and
// SPECIAL-USE (RFC 6154) attributes.
func (s *session) cmdList(ctx context.Context, d *decoder, c *command) (string, error) {
	return s.list(ctx, d, c, false)
}

// cmdLsub: RFC 3501 section 6.3.9.
func (s *session) cmdLsub(ctx context.Context, d *decoder, c *command) (string, error) {
	return s.list(ctx, d, c, true)
}

func (s *session) list(ctx context.Context, d *decoder, c *command, lsub bool) (string, error) {
	var ref, pat string
	err := d.sp()
	if err == nil {
		ref, err = d.mailbox()
	}
	if err == nil {
		err = d.sp()
	}
	if err == nil {
		pat, err = d.listMailbox()
	}
	if err == nil {
		err = d.end()
	}
	if err != nil {
		return "", err
	}
	word := "LIST"
	if lsub {
		word = "LSUB"
	}
	if pat == "" {
		// RFC 3501: the hierarchy delimiter and root name of ref.
		root := ""
		if i := strings.Index(ref, mailbox.Delimiter); i >= 0 {
			root = ref[:i+1]
		}
		s.enc.raw("* ").raw(word).raw(` (\Noselect) "/" `).astring(root).crlf()
		return word + " completed", nil
	}
	infos, err := s.mboxes.List(ctx)
	if err != nil {
		return "", err
	}
	pattern := canonicalPattern(ref + pat)
	for _, e := range hierarchy(infos) {
		if lsub && (e.info == nil || !e.info.Subscribed) {
			continue
		}
		if !match(pattern, e.name) {
			continue
		}
		s.enc.raw("* ").raw(word).raw(" (")
		var attrs []string
		switch {
		case e.info == nil:
			attrs = append(attrs, `\Noselect`)
		case e.info.SpecialUse != "":
			attrs = append(attrs, e.info.SpecialUse)
		}
		if !lsub {
			if e.children {
				attrs = append(attrs, `\HasChildren`)
			} else {
				attrs = append(attrs, `\HasNoChildren`)
			}
		}
		s.enc.raw(strings.Join(attrs, " ")).raw(`) "/" `).astring(e.name).crlf()
	}
	return word + " completed", nil
}

// listEntry is a mailbox name of the hierarchy: an existing mailbox, or
// (info nil) a superior that exists only as part of its inferiors' names.
type listEntry struct {
	name     string
	info     *mailbox.Info
	children bool
}

// hierarchy returns every mailbox and every implied superior, by name.
func hierarchy(infos []mailbox.Info) []listEntry {
	byName := map[string]*listEntry{}
	for i := range infos {
		byName[infos[i].Name] = &listEntry{name: infos[i].Name, info: &infos[i]}
	}
	for i := range infos {
		name := infos[i].Name
		for {
			j := strings.LastIndex(name, mailbox.Delimiter)
			if j < 0 {
				break
			}
			name = name[:j]
			e := byName[name]
			if e == nil {
				e = &listEntry{name: name}
				byName[name] = e
			}
			e.children = true
		}
	}
	out := make([]listEntry, 0, len(byName))
	for _, e := range byName {
		out = append(out, *e)
	}
	sort.Slice(out, func(i, j int) bool {
		// INBOX first, as clients expect.
		if (out[i].name == "INBOX") != (out[j].name == "INBOX") {
			return out[i].name == "INBOX"
		}
		return out[i].name < out[j].name
	})
	return out
}

// canonicalPattern upper-cases a leading INBOX, which is case-insensitive.
func canonicalPattern(p string) string {
	if len(p) >= 5 && strings.EqualFold(p[:5], "INBOX") && (len(p) == 5 || strings.ContainsRune("/%*", rune(p[5]))) {
		return "INBOX" + p[5:]
	}
	return p
}

// match reports whether name matches a LIST pattern: "*" matches anything,
// "%" anything but the delimiter (RFC 3501 section 6.3.8). It runs in
// O(len(pattern) * len(name)).
func match(pattern, name string) bool {
	// prev[j]: pattern[:i] matches name[:j].
	prev := make([]bool, len(name)+1)
	cur := make([]bool, len(name)+1)
	prev[0] = true
	for i := 0; i < len(pattern); i++ {
		p := pattern[i]
		cur[0] = prev[0] && (p == '*' || p == '%')
		for j := 1; j <= len(name); j++ {
			switch p {
			case '*':
				cur[j] = prev[j] || cur[j-1]
			case '%':
				cur[j] = prev[j] || (cur[j-1] && name[j-1] != '/')
			default:
				cur[j] = prev[j-1] && name[j-1] == p
			}
		}
		prev, cur = cur, prev
	}
	return prev[len(name)]
}
