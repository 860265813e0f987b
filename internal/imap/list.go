package imap

import (
	"context"
	"errors"
	"sort"
	"strings"

	"quill/internal/mailbox"
)

// cmdList: RFC 9051 section 6.3.9, with LIST-EXTENDED (RFC 5258),
// LIST-STATUS (RFC 5819), CHILDREN (RFC 3348) and SPECIAL-USE (RFC 6154).
func (s *session) cmdList(ctx context.Context, d *decoder, c *command) (string, error) {
	return s.list(ctx, d, c, false)
}

// cmdLsub: RFC 3501 section 6.3.9.
func (s *session) cmdLsub(ctx context.Context, d *decoder, c *command) (string, error) {
	return s.list(ctx, d, c, true)
}

// listOptions are the selection and return options of an extended LIST.
type listOptions struct {
	subscribed, recursive, specialUse bool // selection
	retSubscribed                     bool
	status                            []string
}

func (s *session) list(ctx context.Context, d *decoder, c *command, lsub bool) (string, error) {
	var opt listOptions
	var ref string
	var pats []string
	err := d.sp()
	if err == nil && !lsub && d.peek() == '(' {
		if err = parseListSelect(d, &opt); err == nil {
			err = d.sp()
		}
	}
	if err == nil {
		ref, err = d.mailbox()
	}
	if err == nil {
		err = d.sp()
	}
	if err == nil {
		if !lsub && d.peek() == '(' {
			err = d.list(func() error {
				p, err := d.listMailbox()
				pats = append(pats, p)
				return err
			})
			if err == nil && len(pats) == 0 {
				err = syntaxErr("empty pattern list")
			}
		} else {
			var p string
			p, err = d.listMailbox()
			pats = append(pats, p)
		}
	}
	if err == nil && !lsub && d.accept(' ') {
		err = parseListReturn(d, &opt)
	}
	if err == nil {
		err = d.end()
	}
	if err != nil {
		return "", err
	}
	if opt.recursive && !opt.subscribed {
		return "", syntaxErr("RECURSIVEMATCH needs another selection option")
	}
	word := "LIST"
	if lsub {
		word = "LSUB"
		opt.subscribed = true
	}
	if len(pats) == 1 && pats[0] == "" {
		// RFC 3501: the hierarchy delimiter and root name of ref.
		root := ""
		if i := strings.Index(ref, mailbox.Delimiter); i >= 0 {
			root = ref[:i+1]
		}
		s.enc.raw("* ").raw(word).raw(` (\Noselect) "/" `).mailbox(root, s.rev2).crlf()
		return word + " completed", nil
	}
	infos, err := s.mboxes.List(ctx)
	if err != nil {
		return "", err
	}
	patterns := make([]string, len(pats))
	for i, p := range pats {
		patterns[i] = canonicalPattern(ref + p)
	}
	matches := func(name string) bool {
		for _, p := range patterns {
			if match(p, name) {
				return true
			}
		}
		return false
	}
	entries := hierarchy(infos)
	// childInfo[name]: a descendant of name matches the selection
	// (RFC 5258 section 3.5, RECURSIVEMATCH).
	childInfo := map[string]bool{}
	if opt.recursive {
		for _, e := range entries {
			if e.info != nil && e.info.Subscribed {
				for n := e.name; ; {
					j := strings.LastIndex(n, mailbox.Delimiter)
					if j < 0 {
						break
					}
					n = n[:j]
					childInfo[n] = true
				}
			}
		}
	}
	for _, e := range entries {
		if !matches(e.name) {
			continue
		}
		selected := true
		switch {
		case opt.subscribed && (e.info == nil || !e.info.Subscribed):
			selected = false
		case opt.specialUse && (e.info == nil || e.info.SpecialUse == ""):
			selected = false
		}
		if !selected && !childInfo[e.name] {
			continue
		}
		s.enc.raw("* ").raw(word).raw(" (")
		attrs := listAttrs(e, lsub)
		if (opt.subscribed || opt.retSubscribed) && !lsub && e.info != nil && e.info.Subscribed {
			attrs = append(attrs, `\Subscribed`)
		}
		s.enc.raw(strings.Join(attrs, " ")).raw(`) "/" `).mailbox(e.name, s.rev2)
		if !selected {
			s.enc.raw(` ("CHILDINFO" ("SUBSCRIBED"))`)
		}
		s.enc.crlf()
		if opt.status != nil && e.info != nil {
			// RFC 5819 section 2: a failure for one mailbox is not the
			// command's; the mailbox may have gone meanwhile.
			if err := s.writeStatus(ctx, e.name, opt.status); err != nil && !errors.Is(err, mailbox.ErrNoSuchMailbox) {
				return "", err
			}
		}
	}
	return word + " completed", nil
}

// parseListSelect reads list-select-opts (RFC 5258 section 6, RFC 6154
// section 6).
func parseListSelect(d *decoder, opt *listOptions) error {
	return d.list(func() error {
		a, err := d.atom("")
		if err != nil {
			return err
		}
		switch strings.ToUpper(a) {
		case "SUBSCRIBED":
			opt.subscribed = true
		case "RECURSIVEMATCH":
			opt.recursive = true
		case "SPECIAL-USE":
			opt.specialUse = true
		case "REMOTE":
			// No remote mailboxes exist here (RFC 5258 section 3.1).
		default:
			return syntaxErr("unknown LIST selection option")
		}
		return nil
	})
}

// parseListReturn reads "RETURN" SP list-return-opts. CHILDREN and
// SPECIAL-USE information is always returned, which RFC 5258 section 4
// and RFC 6154 section 6 allow.
func parseListReturn(d *decoder, opt *listOptions) error {
	a, err := d.atom("")
	if err != nil || !strings.EqualFold(a, "RETURN") {
		return syntaxErr("expected RETURN")
	}
	if err := d.sp(); err != nil {
		return err
	}
	return d.list(func() error {
		a, err := d.atom("")
		if err != nil {
			return err
		}
		switch strings.ToUpper(a) {
		case "SUBSCRIBED":
			opt.retSubscribed = true
		case "CHILDREN", "SPECIAL-USE":
		case "STATUS":
			if err := d.sp(); err != nil {
				return err
			}
			if opt.status, err = parseStatusItems(d); err != nil {
				return err
			}
		default:
			return syntaxErr("unknown LIST return option")
		}
		return nil
	})
}

// listAttrs returns the mailbox attributes of a LIST (or LSUB) response.
func listAttrs(e listEntry, lsub bool) []string {
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
	return attrs
}

// listSelected sends the LIST response IMAP4rev2 SELECT and EXAMINE
// include (RFC 9051 section 6.3.2).
func (s *session) listSelected(ctx context.Context, name string) error {
	infos, err := s.mboxes.List(ctx)
	if err != nil {
		return err
	}
	name = mailbox.CanonicalName(name)
	for _, e := range hierarchy(infos) {
		if e.name == name {
			s.enc.raw("* LIST (").raw(strings.Join(listAttrs(e, false), " ")).raw(`) "/" `).mailbox(e.name, s.rev2).crlf()
			return nil
		}
	}
	return nil
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
