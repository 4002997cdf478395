#!/usr/bin/python3
"""fake_redis.py - a misbehaving Redis for tests/test_redis_fake.c.

Usage: /usr/bin/python3 tests/fake_redis.py MODE [MAX_SECONDS]

Listens on 127.0.0.1 on a free port, prints the port on one line, and serves
every connection in a thread of its own. It exits when its standard input
closes (the test ended) or after MAX_SECONDS (default 120), whichever comes
first. Only the standard library; only loopback traffic.

PING is always answered at once with +PONG (except in 'silent'), so a store
opens; the other commands (SET, GET, DEL, SCAN, STRLEN) get what the mode
says:
  ok          a tiny working Redis (strings only, SCAN in one batch)
  dribble     each reply one byte every 100 ms, padded so it lasts minutes
  silent      nothing at all, not even the PING's reply
  noread      PING answered, then the socket is never read again
  scanloop    SCAN answers cursor 1 with no keys, forever
  scangrow    SCAN answers a new, larger cursor every time, never 0
  hugebulk    GET: "$1073741000" (under the 1 GiB cap), then a byte every 100 ms
  hugerbulk   GET: "$4294967296"; SCAN: an array of 100000000 keys; each then a
              byte every 100 ms
  queued      every command but PING: +QUEUED
  disconnect  half a reply, then the connection is closed
  slowfirst   the first connection behaves as 'dribble', later ones as 'ok'
"""
import os
import socket
import sys
import threading
import time

MODE = sys.argv[1] if len(sys.argv) > 1 else "ok"
MAX_SECONDS = float(sys.argv[2]) if len(sys.argv) > 2 else 120.0
DATA = {}
LOCK = threading.Lock()
CONNECTIONS = [0]


def read_command(f):
    """One RESP array of bulk strings, or None at the end."""
    line = f.readline()
    if not line:
        return None
    if not line.startswith(b"*"):
        return [line.strip()]
    args = []
    for _ in range(int(line[1:])):
        hdr = f.readline()
        if not hdr.startswith(b"$"):
            return None
        n = int(hdr[1:])
        body = f.read(n + 2)
        if len(body) != n + 2:
            return None
        args.append(body[:-2])
    return args


def bulk(b):
    return b"$%d\r\n%s\r\n" % (len(b), b)


def scan_reply(cursor, keys):
    return b"*2\r\n" + bulk(b"%d" % cursor) + b"*%d\r\n" % len(keys) + b"".join(bulk(k) for k in keys)


def glob_prefix(pattern):
    """The literal prefix of a MATCH pattern 'kvq:ns:prefix*' (escapes removed)."""
    out, i = b"", 0
    while i < len(pattern) - 1:
        if pattern[i:i + 1] == b"\\":
            i += 1
        out += pattern[i:i + 1]
        i += 1
    return out


def working_reply(args):
    cmd = args[0].upper()
    with LOCK:
        if cmd == b"SET":
            DATA[args[1]] = args[2]
            return b"+OK\r\n"
        if cmd == b"GET":
            v = DATA.get(args[1])
            return b"$-1\r\n" if v is None else bulk(v)
        if cmd == b"DEL":
            return b":%d\r\n" % (1 if DATA.pop(args[1], None) is not None else 0)
        if cmd == b"STRLEN":
            return b":%d\r\n" % len(DATA.get(args[1], b""))
        if cmd == b"SCAN":
            pre = glob_prefix(args[3]) if len(args) > 3 else b""
            return scan_reply(0, sorted(k for k in DATA if k.startswith(pre)))
    return b"-ERR unknown command\r\n"


def trickle(conn, data, gap=0.1):
    for i in range(len(data)):
        conn.sendall(data[i:i + 1])
        time.sleep(gap)


def serve(conn, mode):
    f = conn.makefile("rb")
    scan_next = [1]
    try:
        if mode == "silent":
            while conn.recv(4096):
                pass
            return
        while True:
            args = read_command(f)
            if args is None:
                return
            cmd = args[0].upper()
            if cmd == b"PING":
                conn.sendall(b"+PONG\r\n")
                if mode == "noread":
                    time.sleep(MAX_SECONDS)
                    return
                continue
            if mode == "ok":
                conn.sendall(working_reply(args))
            elif mode == "dribble":
                # a reply that takes minutes to arrive, one byte at a time
                trickle(conn, b"+" + b"OK" * 3000 + b"\r\n")
            elif mode == "scanloop" and cmd == b"SCAN":
                conn.sendall(scan_reply(1, []))
            elif mode == "scangrow" and cmd == b"SCAN":
                conn.sendall(scan_reply(scan_next[0], []))
                scan_next[0] += 1
            elif mode == "hugebulk" and cmd == b"GET":
                conn.sendall(b"$1073741000\r\n")
                trickle(conn, b"x" * 100000)
            elif mode == "hugerbulk" and cmd == b"GET":
                conn.sendall(b"$4294967296\r\n")
                trickle(conn, b"x" * 100000)
            elif mode == "hugerbulk" and cmd == b"SCAN":
                conn.sendall(b"*2\r\n$1\r\n0\r\n*100000000\r\n")
                trickle(conn, b"$1\r\nx\r\n" * 10000)
            elif mode == "queued":
                conn.sendall(b"+QUEUED\r\n")
            elif mode == "disconnect":
                full = working_reply(args)
                conn.sendall(full[:max(1, len(full) // 2)] if len(full) > 1 else b"")
                return
            else:
                conn.sendall(working_reply(args))
    except (BrokenPipeError, ConnectionResetError, OSError):
        pass
    finally:
        try:
            conn.close()
        except OSError:
            pass


def main():
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    print(srv.getsockname()[1], flush=True)

    def watch_stdin():
        try:
            while sys.stdin.buffer.read(1):
                pass
        except OSError:
            pass
        os._exit(0)

    threading.Thread(target=watch_stdin, daemon=True).start()
    srv.settimeout(0.5)
    end = time.monotonic() + MAX_SECONDS
    while time.monotonic() < end:
        try:
            conn, _ = srv.accept()
        except socket.timeout:
            continue
        with LOCK:
            CONNECTIONS[0] += 1
            nth = CONNECTIONS[0]
        mode = MODE
        if MODE == "slowfirst":
            mode = "dribble" if nth == 1 else "ok"
        threading.Thread(target=serve, args=(conn, mode), daemon=True).start()
    os._exit(0)


if __name__ == "__main__":
    main()
