"""Round trip against the Quill POP3 server with Python's poplib.

Usage: poplib_client.py PORT CAFILE
Logs in as alice over STLS, lists, fetches and deletes, and prints a JSON
summary on stdout for the Go test to compare.
"""
import json
import poplib
import ssl
import sys

port, cafile = int(sys.argv[1]), sys.argv[2]
out = {}

ctx = ssl.create_default_context(cafile=cafile)
p = poplib.POP3("127.0.0.1", port, timeout=20)
out["welcome"] = p.getwelcome().decode()
out["capa_before_tls"] = sorted(p.capa().keys())
p.stls(context=ctx)
out["capa"] = sorted(p.capa().keys())
p.user("alice")
p.pass_("secret")
out["stat"] = list(p.stat())
out["list"] = [l.decode() for l in p.list()[1]]
out["uidl"] = [l.decode() for l in p.uidl()[1]]
out["uidl_2"] = p.uidl(2).decode()
resp, lines, octets = p.retr(2)
out["retr_2"] = [l.decode() for l in lines]
out["retr_2_octets"] = octets
resp, lines, octets = p.top(3, 1)
out["top_3_1"] = [l.decode() for l in lines]
out["dele_1"] = p.dele(1).decode()
try:
    p.retr(1)
    out["retr_deleted"] = "accepted"
except poplib.error_proto as e:
    out["retr_deleted"] = str(e)
out["quit"] = p.quit().decode()

# A second session sees the deletion; SASL PLAIN via poplib's raw interface.
p = poplib.POP3("127.0.0.1", port, timeout=20)
p.stls(context=ctx)
out["auth"] = p._shortcmd("AUTH PLAIN AGFsaWNlAHNlY3JldA==").decode()
out["uidl_after"] = [l.decode() for l in p.uidl()[1]]
p.quit()

json.dump(out, sys.stdout, sort_keys=True, indent=1)
