#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes the seed corpus (tests/fuzz/corpus/<target>/): well-formed inputs of
every kind each target parses, from which libFuzzer mutates. Run it again
after the wire format or the config schema changes; the files are committed."""
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")

SUBSCRIBE, UNSUBSCRIBE, PUBLISH, DELIVER, CREDIT, PING, PONG, ERROR, CLOSE, NO_RESPONDERS, CONNECT = range(1, 12)
INFO = 18


def header_block(*fields):
    """A header block (SPEC.md §3.6): "Name: value\\r\\n" lines, zero-padded to 8."""
    text = b"".join(n + b": " + v + b"\r\n" for n, v in fields)
    return text + b"\0" * ((-len(text)) % 8)


def frame(ftype, subject=b"", reply=b"", payload=b"", arg=0, seq=0, flags=0, headers=b""):
    payload = headers + payload
    head = struct.pack("<HBBHHHHIIIQ", 0x4252, 1, ftype, flags, len(subject), len(reply), len(headers),
                       len(payload), arg, 0, seq)
    body = subject + reply + payload
    pad = (-(len(head) + len(body))) % 8
    return head + body + b"\0" * pad


def handshake(word, *fields, version=1, byte5=0):
    return struct.pack("<IBBH", 0x31424452, version, byte5, word) + b"".join(fields)


def crc32c(data):
    """CRC32C (Castagnoli), as the store's records carry it (docs/streams.md)."""
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def record(seq, subject, payload, time_ns=1, headers=b""):
    """A stored record (docs/streams.md, "Storage"): 32-byte header, subject, headers, payload."""
    rest = struct.pack("<QqHHI", seq, time_ns, len(subject), 0, len(headers)) + subject + headers + payload
    length = 8 + len(rest)
    return struct.pack("<II", length, crc32c(rest)) + rest


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def main():
    shutil.rmtree(CORPUS, ignore_errors=True)
    pub = frame(PUBLISH, b"orders.eu.created", payload=b"hello", seq=7)
    req = frame(PUBLISH, b"svc.time", b"_INBOX.ab12.1", b"now?", flags=1)
    traced = frame(PUBLISH, b"orders.eu", payload=b"{}",
                   headers=header_block((b"Trace-Id", b"4bf92f35"), (b"Accept", b"a"), (b"Accept", b"")))
    seeds = {
        "subscribe": frame(SUBSCRIBE, b"orders.*.created", arg=1),
        "subscribe_queue": frame(SUBSCRIBE, b"work.>", b"workers", arg=2),
        "unsubscribe": frame(UNSUBSCRIBE, arg=1),
        "publish": pub,
        "request": req,
        "deliver": frame(DELIVER, payload=pub + frame(PUBLISH, b"orders.eu.created", payload=b"x" * 40), arg=1),
        "credit": frame(CREDIT, arg=32),
        "ping_pong": frame(PING) + frame(PONG),
        "error": frame(ERROR, payload=b"invalid subject", arg=4),
        "close": frame(CLOSE, payload=b"slow consumer", arg=9),
        "no_responders": frame(NO_RESPONDERS, b"_INBOX.ab12.1"),
        "stream": frame(CONNECT, payload=b"alicesecret", arg=5) + frame(SUBSCRIBE, b">", arg=3) + pub + req + frame(PING),
        "connect_token": frame(CONNECT, payload=b"tok-123"),
        "connect_anonymous": frame(CONNECT) + frame(PING),
        "stream_truncated": (pub + req)[:-13],
        "publish_headers": traced,
        "deliver_headers": frame(DELIVER, payload=pub + traced, arg=1),
        "route_connect": frame(CONNECT, b"prod", b"0123456789abcdef,rdma://10.0.0.1:7472", b"routes3cret", arg=5,
                               flags=8),
        "info": frame(INFO, payload=b"id 0123456789abcdef\ncluster prod\nurl rdma://10.0.0.1:7470\n"
                                    b"route rdma://10.0.0.1:7472\npeer_url fedcba9876543210 tcp://10.0.0.2:7471\n"
                                    b"peer_route fedcba9876543210 tcp://10.0.0.2:7473\npeer 00000000000000aa\n"),
    }
    for name, data in seeds.items():
        write("fuzz_frame", name, data)

    write("fuzz_handshake", "request", handshake(0, struct.pack("<II", 16384, 32)))
    write("fuzz_handshake", "accept", handshake(0, struct.pack("<IIQ", 16384, 32, 42)))
    write("fuzz_handshake", "request_v2", handshake(0, struct.pack("<II", 16384, 32), byte5=2))
    write("fuzz_handshake", "accept_v2", handshake(0, struct.pack("<IIQ", 16384, 32, 42), version=2))
    write("fuzz_handshake", "reject_buffer", handshake(3, struct.pack("<II", 65536, 0)))
    write("fuzz_handshake", "padded", handshake(0, struct.pack("<II", 4096, 2)) + b"\0" * 40)

    for i, text in enumerate(["orders.*\norders.eu\n>", "a.>\na.b.c\na.*.c", ">\nx\n*",
                              "orders.eu.created\norders.eu.created\norders.*.created",
                              "_INBOX.*\n_INBOX.ab12\nsvc.>", "a.*.*.d\na.b.c.d\n*.b.>"]):
        write("fuzz_subject", f"seed{i}", text)

    with open(os.path.join(HERE, "..", "..", "config", "broker.yaml")) as f:
        write("fuzz_config", "broker_yaml", f.read())
    configs = {
        "minimal": "workers: 2\n",
        "listeners": "listen:\n  rdma: 0.0.0.0:7471\n  tcp: 127.0.0.1:4222\n",
        "limits": "limits:\n  max_connections: 10\n  max_payload: 1024\n",
        "logging": "logging:\n  level: debug\n  format: json\n",
        "wrong_type": "workers: many\n",
        "flow_seq": "flow: [1, 2]\n",
        "unknown": "nonsense:\n  key: 1\n",
        "auth": "auth:\n  anonymous: true\n  anonymous_permissions:\n    subscribe: {allow: [\"public.>\"]}\n"
                "  users:\n    - name: alice\n      password: \"$6$rounds=1000$fnhyAvh8lJCQuE45$XMCSqNzrnurY8jX7KFED7igC0gRZaiMHdqP5qrrAuI.RVWcDhtbeqKhwKeu265AN3c5WjQag5PSCv8SzQyt7O1\"\n"
                "      publish: {allow: [\"orders.>\"], deny: [orders.secret]}\n"
                "    - {name: ingest, token: \"$y$j9T$a.aowhM6ExMXnwd/NDvRc/$N3Pcz8NP.ShNLffGmOw6IDN9soJVq1poIQcYZ5.cAT8\"}\n",
    }
    for name, text in configs.items():
        write("fuzz_config", name, text)

    # fuzz_store: meta.json @@@@ segment 1 @@@@ segment 5 @@@@ consumers/d.json
    seg1 = b"".join(record(i, b"orders.x", b"m%d" % i, time_ns=i) for i in range(1, 5))
    seg5 = b"".join(record(i, b"orders.y", b"m%d" % i, time_ns=i,
                           headers=header_block((b"Msg-Id", b"id-%d" % i))) for i in range(5, 8))
    consumer = (b'{"version":1,"owner":"alice","config":{"start":0,"ack":1,"pull":false,"original_pace":false,'
                b'"max_ack_pending":1024,"start_at":0,"ack_wait_ms":30000,"max_deliver":0},"next":3,'
                b'"pending":[[2,1]],"initial":[]}')
    meta = b'{"first_sequence": 2, "reserved_through": 1048576}'
    stores = {
        "whole": meta + b"@@@@" + seg1 + b"@@@@" + seg5 + b"@@@@" + consumer,
        "torn_tail": b"@@@@" + seg1 + b"@@@@" + seg5[:-13] + b"@@@@",
        "no_meta": b"@@@@" + seg1 + b"@@@@@@@@" + consumer,
        "zero_tail": b"@@@@" + seg1 + b"\0" * 40 + b"@@@@@@@@",
    }
    for name, data in stores.items():
        write("fuzz_store", name, data)


if __name__ == "__main__":
    main()
