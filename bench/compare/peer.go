package main

import (
	"context"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// peer is a private Postfix (inbound SMTP) delivering over LMTP to a
// private Dovecot (LMTP, POP3 and IMAP, Maildir, passwd-file users), both on
// loopback ports chosen at run time, under one temporary root.
//
// Durability equal to Quill's: Postfix's cleanup fsyncs the queue file
// before smtpd answers 250 (Postfix has no switch to turn that off), and
// Dovecot with mail_fsync = always fsyncs each Maildir file and directory
// before LMTP answers 250, after which Postfix removes its queue file.
type peer struct {
	root                         string
	smtpAddr, pop3Addr, imapAddr string
	pfCfg, pfQueue               string
	dovecot                      *child
	postfixUp                    bool
}

// startPeer configures and starts Dovecot and Postfix for domain and the
// users of passwd (address -> password hash in PHC form), with a credential
// cache of lifetime authTTL (0: none).
func startPeer(ctx context.Context, root, domain string, users []string, hash string, authTTL time.Duration) (*peer, error) {
	p := &peer{root: root}
	smtpPort, err1 := freePort()
	lmtpPort, err2 := freePort()
	pop3Port, err3 := freePort()
	imapPort, err4 := freePort()
	for _, err := range []error{err1, err2, err3, err4} {
		if err != nil {
			return nil, err
		}
	}
	p.smtpAddr = fmt.Sprintf("127.0.0.1:%d", smtpPort)
	p.pop3Addr = fmt.Sprintf("127.0.0.1:%d", pop3Port)
	p.imapAddr = fmt.Sprintf("127.0.0.1:%d", imapPort)
	lmtpAddr := fmt.Sprintf("127.0.0.1:%d", lmtpPort)
	if err := p.startDovecot(ctx, domain, users, hash, authTTL, lmtpPort, pop3Port, imapPort); err != nil {
		p.stop(ctx)
		return nil, err
	}
	if err := p.startPostfix(ctx, domain, smtpPort, lmtpAddr); err != nil {
		p.stop(ctx)
		return nil, err
	}
	return p, nil
}

func (p *peer) startDovecot(ctx context.Context, domain string, users []string, hash string, authTTL time.Duration, lmtpPort, pop3Port, imapPort int) error {
	dir := filepath.Join(p.root, "dovecot")
	mail := filepath.Join(p.root, "maildirs")
	for _, d := range []string{dir, filepath.Join(dir, "run"), filepath.Join(dir, "state"), mail} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	mu, err := user.Lookup("mail")
	if err != nil {
		return fmt.Errorf("the mail user owns the Maildirs: %w", err)
	}
	uid, _ := strconv.Atoi(mu.Uid)
	gid, _ := strconv.Atoi(mu.Gid)
	if err := os.Chown(mail, uid, gid); err != nil {
		return err
	}
	var pw strings.Builder
	for _, u := range users {
		// Quill's own argon2id hash: both servers pay the same KDF per login.
		fmt.Fprintf(&pw, "%s:{ARGON2ID}%s\n", u, hash)
	}
	passwd := filepath.Join(dir, "passwd")
	if err := os.WriteFile(passwd, []byte(pw.String()), 0o644); err != nil {
		return err
	}
	conf := dovecotAuthCache(authTTL) + fmt.Sprintf(`# Private Dovecot for the Quill benchmark (bench/compare).
protocols = pop3 imap lmtp
listen = 127.0.0.1
base_dir = %[1]s/run
state_dir = %[1]s/state
log_path = %[1]s/dovecot.log
info_log_path = %[1]s/dovecot.log
ssl = no
disable_plaintext_auth = no
auth_mechanisms = plain
auth_username_format = %%Lu
mail_location = maildir:%[2]s/%%d/%%n
# Equal durability: fsync every mail file (and its directory) before
# LMTP answers 250.
mail_fsync = always
lmtp_save_to_detail_mailbox = no
# The load comes from one address at up to hundreds of clients: no
# process limit of the defaults (100 per service) may bind before the
# machine does. Processes are started only as connections need them.
default_process_limit = 1000
first_valid_uid = %[3]d
first_valid_gid = %[4]d
pop3_uidl_format = %%08Xu%%08Xv
passdb {
  driver = passwd-file
  args = scheme=ARGON2ID %[5]s
}
userdb {
  driver = static
  args = uid=%[3]d gid=%[4]d home=%[2]s/%%d/%%n
}
service lmtp {
  inet_listener lmtp {
    address = 127.0.0.1
    port = %[6]d
  }
  unix_listener lmtp {
    mode = 0600
  }
}
service pop3-login {
  inet_listener pop3 {
    address = 127.0.0.1
    port = %[7]d
  }
  inet_listener pop3s {
    port = 0
  }
}
service imap-login {
  inet_listener imap {
    address = 127.0.0.1
    port = %[9]d
  }
  inet_listener imaps {
    port = 0
  }
}
protocol lmtp {
  postmaster_address = postmaster@%[8]s
}
`, dir, mail, uid, gid, passwd, lmtpPort, pop3Port, domain, imapPort)
	cfg := filepath.Join(dir, "dovecot.conf")
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		return err
	}
	c, _, err := startChild(ctx, p.root, "dovecot", false, "/usr/sbin/dovecot", "-F", "-c", cfg)
	if err != nil {
		return err
	}
	p.dovecot = c
	for _, port := range []int{lmtpPort, pop3Port, imapPort} {
		if err := waitListening(ctx, fmt.Sprintf("127.0.0.1:%d", port), c.running); err != nil {
			log, _ := os.ReadFile(filepath.Join(dir, "dovecot.log"))
			return fmt.Errorf("dovecot: %w\n%s", err, tail(log))
		}
	}
	return nil
}

func (p *peer) startPostfix(ctx context.Context, domain string, smtpPort int, lmtpAddr string) error {
	pw, err := user.Lookup("postfix")
	if err != nil {
		return fmt.Errorf("the postfix user is missing: %w", err)
	}
	uid, _ := strconv.Atoi(pw.Uid)
	gid, _ := strconv.Atoi(pw.Gid)
	dir := filepath.Join(p.root, "postfix")
	p.pfCfg = filepath.Join(dir, "etc")
	p.pfQueue = filepath.Join(dir, "queue")
	data := filepath.Join(dir, "data")
	for _, d := range []string{p.pfCfg, p.pfQueue, data} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := os.Chown(data, uid, gid); err != nil {
		return err
	}
	lmtp := "lmtp:inet:" + lmtpAddr
	mainCF := strings.Join([]string{
		"compatibility_level = 3.6",
		"config_directory = " + p.pfCfg,
		"queue_directory = " + p.pfQueue,
		"data_directory = " + data,
		"mail_owner = postfix",
		"setgid_group = postdrop",
		"maillog_file = " + filepath.Join(dir, "maillog"),
		"maillog_file_prefixes = " + dir,
		"myhostname = mta.bench.invalid",
		"mydomain = bench.invalid",
		"myorigin = $myhostname",
		"mydestination = " + domain,
		"inet_interfaces = 127.0.0.1",
		"inet_protocols = ipv4",
		"mynetworks = 127.0.0.0/8",
		// Every local recipient goes to Dovecot over LMTP; Dovecot's
		// passwd-file is the user list, so Postfix has no local tables.
		"local_transport = " + lmtp,
		"default_transport = " + lmtp,
		"local_recipient_maps =",
		"alias_maps =",
		"alias_database =",
		// Minimal restrictions, no DNS, no filters.
		"smtpd_relay_restrictions = permit_mynetworks, reject_unauth_destination",
		"smtpd_recipient_restrictions =",
		"smtpd_helo_required = no",
		"smtpd_peername_lookup = no",
		"smtp_dns_support_level = disabled",
		"lmtp_dns_support_level = disabled",
		"smtpd_client_connection_count_limit = 1000",
		"append_dot_mydomain = no",
		"biff = no",
		"smtputf8_enable = no",
		"smtpd_tls_security_level = none",
		"lmtp_tls_security_level = none",
		"delay_warning_time = 0",
		"",
	}, "\n")
	masterCF := strings.Join([]string{
		// maxproc 1000, not default_process_limit's 100: one smtpd per
		// client connection, and the bench may run hundreds.
		fmt.Sprintf("127.0.0.1:%d inet n - n - 1000 smtpd", smtpPort),
		"pickup    unix  n       -       n       60      1       pickup",
		"cleanup   unix  n       -       n       -       0       cleanup",
		"qmgr      unix  n       -       n       300     1       qmgr",
		"rewrite   unix  -       -       n       -       -       trivial-rewrite",
		"bounce    unix  -       -       n       -       0       bounce",
		"defer     unix  -       -       n       -       0       bounce",
		"trace     unix  -       -       n       -       0       bounce",
		"verify    unix  -       -       n       -       1       verify",
		"flush     unix  n       -       n       1000?   0       flush",
		"proxymap  unix  -       -       n       -       -       proxymap",
		"showq     unix  n       -       n       -       -       showq",
		"error     unix  -       -       n       -       -       error",
		"retry     unix  -       -       n       -       -       error",
		"discard   unix  -       -       n       -       -       discard",
		"smtp      unix  -       -       n       -       -       smtp",
		"lmtp      unix  -       -       n       -       -       lmtp",
		"anvil     unix  -       -       n       -       1       anvil",
		"scache    unix  -       -       n       -       1       scache",
		"postlog   unix-dgram n  -       n       -       1       postlogd",
		"",
	}, "\n")
	if err := os.WriteFile(filepath.Join(p.pfCfg, "main.cf"), []byte(mainCF), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(p.pfCfg, "master.cf"), []byte(masterCF), 0o644); err != nil {
		return err
	}
	if _, err := runCmd(ctx, nil, "/usr/sbin/postfix", "-c", p.pfCfg, "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "maillog"))
		return fmt.Errorf("postfix: %w\n%s", err, tail(log))
	}
	p.postfixUp = true
	return waitListening(ctx, p.smtpAddr, nil)
}

// processes returns the process trees to measure: Postfix's master (with
// smtpd, cleanup, qmgr, lmtp beneath it) and Dovecot's master (with lmtp,
// pop3-login, pop3, imap-login, imap, auth).
func (p *peer) processes() (map[string]int, error) {
	pf, err := readPID(filepath.Join(p.pfQueue, "pid", "master.pid"))
	if err != nil {
		return nil, fmt.Errorf("postfix master pid: %w", err)
	}
	return map[string]int{"postfix": pf, "dovecot": p.dovecot.pid()}, nil
}

// queueEmpty reports whether Postfix holds no message: nothing in its
// incoming, active, deferred or hold queues.
func (p *peer) queueEmpty() (bool, error) {
	for _, q := range []string{"incoming", "active", "deferred", "hold", "maildrop"} {
		n := 0
		err := filepath.WalkDir(filepath.Join(p.pfQueue, q), func(_ string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() {
				n++
			}
			return nil
		})
		if err != nil && !os.IsNotExist(err) {
			return false, err
		}
		if n > 0 {
			return false, nil
		}
	}
	return true, nil
}

// waitQueueEmpty waits until Postfix has delivered everything it holds,
// so that one run's backlog does not slow the next. The tick paces the
// polling of an observable condition.
func (p *peer) waitQueueEmpty(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		empty, err := p.queueEmpty()
		if err != nil || empty {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postfix queue not empty after %v", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// stop stops Postfix, then Dovecot. It is safe on a half-started peer.
func (p *peer) stop(ctx context.Context) {
	if p.postfixUp {
		// A fresh context: stop even when the run's was cancelled.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
		if _, err := runCmd(sctx, nil, "/usr/sbin/postfix", "-c", p.pfCfg, "stop"); err != nil {
			fmt.Fprintf(os.Stderr, "compare: %v\n", err)
		}
		cancel()
		p.postfixUp = false
	}
	if p.dovecot != nil {
		p.dovecot.stop()
		p.dovecot = nil
	}
}

// tail returns the last 4 KiB of a log.
func tail(b []byte) string {
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return string(b)
}

// dovecotAuthCache is the auth cache section of dovecot.conf: Dovecot's
// equivalent of Quill's login cache (auth.cache_ttl), off or with the same
// lifetime. Dovecot's cache keeps the passdb's answer, the stored hash, and
// still verifies every login against it: a hit saves the passwd-file lookup,
// not the argon2id run, which the auth workers then share (Quill's cache
// skips the KDF). Negative answers are not cached, as Quill caches none.
func dovecotAuthCache(ttl time.Duration) string {
	if ttl <= 0 {
		return "# No credential cache, as Quill runs with none (--auth-cache off).\nauth_cache_size = 0\n"
	}
	return fmt.Sprintf("# The credential cache, as long as Quill's (--auth-cache).\n"+
		"auth_cache_size = 64M\nauth_cache_ttl = %d s\nauth_cache_negative_ttl = 0\nauth_cache_verify_password_with_worker = yes\n", int(ttl.Seconds()))
}
