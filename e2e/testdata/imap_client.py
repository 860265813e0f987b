#!/usr/bin/env python3
"""Drive Quill's IMAP server with Python's imaplib, as a mail client does.

Usage: imap_client.py HOST PORT USER PASSWORD

Logs in over STARTTLS, starts COMPRESS=DEFLATE (RFC 4978: raw deflate
both ways, zlib with wbits=-15, a sync flush after each send), lists, creates, appends, selects, fetches, stores,
searches, copies, moves and expunges, then IDLEs: it prints the line
"IDLING" and waits for the server to push EXISTS (the test delivers a
message by SMTP when it reads that line). The last stdout line is one
JSON object with what the server answered; any protocol failure raises
and exits non-zero.
"""
import imaplib
import json
import re
import ssl
import sys
import time
import zlib

host, port, user, password = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
out = {}

def ok(res):
    typ, data = res
    if typ != "OK":
        raise SystemExit("command failed: %r %r" % (typ, data))
    return data

M = imaplib.IMAP4(host, port)
out["caps_before_tls"] = sorted(M.capabilities)
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
ok(M.starttls(ssl_context=ctx))
ok(M.login(user, password))
out["caps"] = sorted(M.capabilities)


class Deflated:
    """COMPRESS=DEFLATE under imaplib's read, readline and send."""

    def __init__(self, m):
        self.m = m
        self.inflate = zlib.decompressobj(wbits=-15)
        self.deflate = zlib.compressobj(wbits=-15)
        self.buf = b""
        self.wire_in = 0
        self.plain_in = 0

    def _fill(self):
        data = self.m.file.read1(65536)
        if not data:
            return False
        self.wire_in += len(data)
        plain = self.inflate.decompress(data)
        self.plain_in += len(plain)
        self.buf += plain
        return True

    def read(self, size):
        while len(self.buf) < size and self._fill():
            pass
        r, self.buf = self.buf[:size], self.buf[size:]
        return r

    def readline(self):
        while b"\n" not in self.buf and self._fill():
            pass
        i = self.buf.find(b"\n")
        end = len(self.buf) if i < 0 else i + 1
        r, self.buf = self.buf[:end], self.buf[end:]
        return r

    def send(self, data):
        self.m.sock.sendall(self.deflate.compress(data) + self.deflate.flush(zlib.Z_SYNC_FLUSH))


imaplib.Commands.setdefault("COMPRESS", ("AUTH", "SELECTED"))
ok(M._simple_command("COMPRESS", "DEFLATE"))
z = Deflated(M)
M.read, M.readline, M.send = z.read, z.readline, z.send

out["list"] = [l.decode() for l in ok(M.list())]
ok(M.create("Projects/Quill"))
msg = (b"From: Python <py@example.test>\r\nTo: " + user.encode() +
       b"\r\nSubject: hello from imaplib\r\n\r\nline one\r\nline two\r\n")
data = ok(M.append("INBOX", r"(\Flagged)", imaplib.Time2Internaldate(time.time()), msg))
out["appenduid"] = data[0].decode()

data = ok(M.select("INBOX"))
out["exists"] = int(data[0])
data = ok(M.fetch("1:*", "(UID FLAGS RFC822.SIZE)"))
out["fetch"] = [d.decode() for d in data]
data = ok(M.fetch("2", "(BODY.PEEK[])"))
out["body_equal"] = data[0][1] == msg
ok(M.store("1", "+FLAGS", r"(\Seen)"))
out["unseen"] = ok(M.search(None, "UNSEEN"))[0].decode()
out["search_subject"] = ok(M.uid("SEARCH", "SUBJECT", "imaplib"))[0].decode()
out["copy"] = M.copy("1", "Archive")[0]
typ, data = M.uid("MOVE", "1", "Trash")
out["move"] = typ
ok(M.select("Archive"))
ok(M.store("1", "+FLAGS", r"(\Deleted)"))
out["expunge"] = [d.decode() for d in ok(M.expunge()) if d]
out["status_archive"] = ok(M.status("Archive", "(MESSAGES)"))[0].decode()
out["status_trash"] = ok(M.status("Trash", "(MESSAGES)"))[0].decode()

# IDLE (RFC 2177) by hand: imaplib before 3.14 has no idle().
ok(M.select("INBOX"))
tag = M._new_tag()
M.send(tag + b" IDLE\r\n")
line = M.readline()
if not line.startswith(b"+"):
    raise SystemExit("IDLE refused: %r" % line)
print("IDLING", flush=True)
pushed = []
while True:
    line = M.readline()
    if not line:
        raise SystemExit("connection closed during IDLE")
    pushed.append(line.decode().strip())
    if re.match(rb"\* \d+ EXISTS", line):
        break
M.send(b"DONE\r\n")
while True:
    line = M.readline()
    if line.startswith(tag):
        out["idle_done"] = line.decode().strip()
        break
    pushed.append(line.decode().strip())
out["idle_pushed"] = pushed
data = ok(M.fetch("*", "(BODY.PEEK[HEADER.FIELDS (SUBJECT)])"))
out["idle_subject"] = data[0][1].decode().strip()
out["compress_wire_in"] = z.wire_in
out["compress_plain_in"] = z.plain_in
M.logout()
print(json.dumps(out))
