#!/usr/bin/env python3
"""Drive Quill's SMTP listeners with Python's smtplib, for e2e/python_test.go.

Each mode performs one transaction and prints one JSON object on stdout
describing what the server answered; the Go test owns the assertions. A
protocol failure that smtplib raises is reported in the JSON ("error" with
the SMTP code), anything else exits non-zero with a traceback.

Modes:
  pipelined     plain SMTP (MX listener): MAIL, every RCPT and DATA sent in
                one write (RFC 2920), then the message.
  starttls      STARTTLS, then AUTH with --mech PLAIN|LOGIN|LOGIN-NOIR
                (LOGIN without the initial response), then sendmail.
  implicit      implicit TLS (RFC 8314), AUTH PLAIN, sendmail.
  badpass       STARTTLS, AUTH PLAIN with --password: expect a refusal.

TLS certificates are not verified: Quill's is self-signed.
"""
import argparse
import base64
import json
import re
import smtplib
import ssl
import sys

TIMEOUT = 30


def context():
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def text(b):
    return b.decode("utf-8", "replace") if isinstance(b, bytes) else str(b)


def stuff(msg):
    """RFC 5321 section 4.5.2 transparency, and a final CRLF."""
    msg = re.sub(rb"(?m)^\.", b"..", msg)
    if not msg.endswith(b"\r\n"):
        msg += b"\r\n"
    return msg


def pipelined(a, msg, out):
    s = smtplib.SMTP(a.host, a.port, local_hostname="client.e2e.test", timeout=TIMEOUT)
    code, _ = s.ehlo()
    out["ehlo"] = code
    out["extensions"] = sorted(s.esmtp_features)
    if not s.has_extn("pipelining"):
        out["error"] = "server does not advertise PIPELINING"
        return
    cmds = ["MAIL FROM:<%s>" % a.sender] + ["RCPT TO:<%s>" % r for r in a.to] + ["DATA"]
    s.send("".join(c + "\r\n" for c in cmds))
    out["replies"] = [[c, code, text(m)] for c, (code, m) in zip(cmds, (s.getreply() for _ in cmds))]
    if out["replies"][-1][1] != 354:
        s.rset()
        s.quit()
        return
    s.send(stuff(msg) + b".\r\n")
    code, m = s.getreply()
    out["data"] = [code, text(m)]
    code, _ = s.quit()
    out["quit"] = code


def authenticate(s, a, mech):
    s.user, s.password = a.user, a.password
    if mech == "PLAIN":
        return s.auth("PLAIN", s.auth_plain)
    if mech == "LOGIN":
        # smtplib sends the user name as an initial response (RFC 4954).
        return s.auth("LOGIN", s.auth_login)
    if mech == "LOGIN-NOIR":
        return s.auth("LOGIN", s.auth_login, initial_response_ok=False)
    raise ValueError(mech)


def send(s, a, msg, out):
    try:
        refused = s.sendmail(a.sender, a.to, msg)
        out["refused"] = {k: [c, text(m)] for k, (c, m) in refused.items()}
        out["sent"] = True
    except smtplib.SMTPRecipientsRefused as e:
        out["error"] = {"kind": "recipients", "refused": {k: [c, text(m)] for k, (c, m) in e.recipients.items()}}
    except smtplib.SMTPResponseException as e:
        out["error"] = {"kind": type(e).__name__, "code": e.smtp_code, "text": text(e.smtp_error)}
    s.quit()


def starttls(a, msg, out, mech):
    s = smtplib.SMTP(a.host, a.port, local_hostname="client.e2e.test", timeout=TIMEOUT)
    s.ehlo()
    out["extensions_before_tls"] = sorted(s.esmtp_features)
    code, _ = s.starttls(context=context())
    out["starttls"] = code
    out["cipher"] = s.sock.cipher()[0]
    out["tls_version"] = s.sock.version()
    s.ehlo()
    out["extensions"] = sorted(s.esmtp_features)
    out["auth_mechanisms"] = s.esmtp_features.get("auth", "").split()
    try:
        code, m = authenticate(s, a, mech)
        out["auth"] = [code, text(m)]
    except smtplib.SMTPAuthenticationError as e:
        out["auth"] = [e.smtp_code, text(e.smtp_error)]
        s.quit()
        return
    if msg is not None:
        send(s, a, msg, out)
    else:
        s.quit()


def implicit(a, msg, out):
    s = smtplib.SMTP_SSL(a.host, a.port, local_hostname="client.e2e.test", timeout=TIMEOUT, context=context())
    out["tls_version"] = s.sock.version()
    s.ehlo()
    out["extensions"] = sorted(s.esmtp_features)
    code, m = authenticate(s, a, "PLAIN")
    out["auth"] = [code, text(m)]
    send(s, a, msg, out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["pipelined", "starttls", "implicit", "badpass"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--user")
    p.add_argument("--password")
    p.add_argument("--mech", default="PLAIN", choices=["PLAIN", "LOGIN", "LOGIN-NOIR"])
    p.add_argument("--from", dest="sender", default="")
    p.add_argument("--to", action="append", default=[])
    p.add_argument("--message", help="file with the message (CRLF lines)")
    a = p.parse_args()
    msg = open(a.message, "rb").read() if a.message else None
    out = {"mode": a.mode}
    if a.mode == "pipelined":
        pipelined(a, msg, out)
    elif a.mode == "starttls":
        starttls(a, msg, out, a.mech)
    elif a.mode == "implicit":
        implicit(a, msg, out)
    elif a.mode == "badpass":
        starttls(a, None, out, a.mech)
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
