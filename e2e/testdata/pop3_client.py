#!/usr/bin/env python3
"""Drive Quill's POP3 listener with Python's poplib, for e2e/python_test.go.

Each mode prints one JSON object on stdout describing what the server
answered; the Go test owns the assertions. -ERR replies are captured as
{"err": "..."}; anything else unexpected exits non-zero with a traceback.

Modes:
  inspect   CAPA, [STLS,] login, STAT, LIST, UIDL, TOP n 0, TOP n 2 and
            RETR of every message (base64), then QUIT (deletes nothing).
  delete    DELE --msg N (repeatable), then per --finish: "quit" (commit,
            RFC 1939 UPDATE state), "rset" (RSET then QUIT: nothing is
            deleted) or "drop" (close without QUIT: nothing is deleted).
  inuse     log in twice concurrently: the second login must be refused
            (RFC 2449 [IN-USE]); after the first QUITs, it must succeed.

--stls upgrades with STLS (RFC 2595) before logging in; TLS certificates
are not verified (Quill's is self-signed). Without it, USER/PASS go in the
clear, which Quill allows from loopback only.
"""
import argparse
import base64
import json
import poplib
import ssl
import sys

TIMEOUT = 30


def text(b):
    return b.decode("utf-8", "replace") if isinstance(b, bytes) else str(b)


def context():
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def connect(a, out=None):
    p = poplib.POP3(a.host, a.port, timeout=TIMEOUT)
    if out is not None:
        out["greeting"] = text(p.getwelcome())
        out["capa"] = sorted(p.capa().keys())
    if a.stls:
        resp = p.stls(context=context())
        if out is not None:
            out["stls"] = text(resp)
            out["tls_version"] = p.sock.version()
            out["capa_after_stls"] = sorted(p.capa().keys())
    return p


def login(p, a):
    p.user(a.user)
    return text(p.pass_(a.password))


def lines_to_bytes(lines):
    return b"".join(l + b"\r\n" for l in lines)


def inspect(a, out):
    p = connect(a, out)
    out["login"] = login(p, a)
    n, size = p.stat()
    out["stat"] = [n, size]
    _, listing, _ = p.list()
    out["list"] = [text(l).split() for l in listing]
    _, uidl, _ = p.uidl()
    out["uidl"] = [text(l).split() for l in uidl]
    out["messages"] = []
    for i in range(1, n + 1):
        _, top0, _ = p.top(i, 0)
        _, top2, _ = p.top(i, 2)
        _, body, _ = p.retr(i)
        out["messages"].append({
            "list_one": text(p.list(i)),
            "uidl_one": text(p.uidl(i)),
            "top0": base64.b64encode(lines_to_bytes(top0)).decode(),
            "top2": base64.b64encode(lines_to_bytes(top2)).decode(),
            "retr": base64.b64encode(lines_to_bytes(body)).decode(),
        })
    try:
        p.retr(n + 1)
        out["retr_past_end"] = "+OK"
    except poplib.error_proto as e:
        out["retr_past_end"] = text(e.args[0])
    out["quit"] = text(p.quit())


def delete(a, out):
    p = connect(a)
    out["login"] = login(p, a)
    out["stat_before"] = list(p.stat())
    out["dele"] = [text(p.dele(m)) for m in a.msg]
    out["stat_after_dele"] = list(p.stat())
    try:
        p.retr(a.msg[0])
        out["retr_deleted"] = "+OK"
    except poplib.error_proto as e:
        out["retr_deleted"] = text(e.args[0])
    if a.finish == "rset":
        out["rset"] = text(p.rset())
        out["stat_after_rset"] = list(p.stat())
        out["quit"] = text(p.quit())
    elif a.finish == "quit":
        out["quit"] = text(p.quit())
    else:
        p.close()  # no QUIT: the session never enters the UPDATE state


def inuse(a, out):
    first = connect(a)
    out["first_login"] = login(first, a)
    second = connect(a)
    try:
        out["second_login"] = login(second, a)
    except poplib.error_proto as e:
        out["second_login_err"] = text(e.args[0])
    second.close()
    out["first_quit"] = text(first.quit())
    third = connect(a)
    out["third_login"] = login(third, a)
    out["third_quit"] = text(third.quit())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["inspect", "delete", "inuse"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--user", required=True)
    p.add_argument("--password", required=True)
    p.add_argument("--stls", action="store_true")
    p.add_argument("--msg", type=int, action="append", default=[])
    p.add_argument("--finish", choices=["quit", "rset", "drop"], default="quit")
    a = p.parse_args()
    out = {"mode": a.mode}
    try:
        {"inspect": inspect, "delete": delete, "inuse": inuse}[a.mode](a, out)
    except poplib.error_proto as e:
        out["err"] = text(e.args[0])
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
