#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What the Python package costs: one publisher and one callback subscriber,
each its own connection, N messages of SIZE bytes flat out; prints the
publish rate and the delivery rate (messages/s), as `rdmabroker bench` does
for the C++ library (tests/bench/python.sh runs both on one broker).

    bench.py URL [--bind ADDR] [-n N] [--size BYTES]
"""

import argparse
import json
import threading
import time

import rdmabroker


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("--bind")
    p.add_argument("-n", "--count", type=int, default=100_000)
    p.add_argument("--size", type=int, default=64)
    a = p.parse_args()

    done = threading.Event()
    received = 0
    last = [0.0]

    def count(_m):
        nonlocal received
        received += 1
        if received == a.count:
            last[0] = time.perf_counter()
            done.set()

    payload = b"x" * a.size
    with rdmabroker.connect(a.url, a.bind) as sub, rdmabroker.connect(a.url, a.bind) as pub:
        sub.subscribe("bench.py", callback=count)
        sub.flush()
        start = time.perf_counter()
        for _ in range(a.count):
            pub.publish("bench.py", payload)
        published = time.perf_counter()
        pub.flush(timeout=60)
        if not done.wait(timeout=120):
            raise SystemExit(f"bench.py: {received} of {a.count} messages arrived")
    print(json.dumps({
        "messages": a.count, "size": a.size,
        "publish_msgs_per_s": round(a.count / (published - start)),
        "delivery_msgs_per_s": round(a.count / (last[0] - start)),
    }))


if __name__ == "__main__":
    main()
