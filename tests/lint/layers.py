#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The daemon's layers (docs/architecture.md, "Layers"): each folder of
daemon/ has a floor, and a file may include only files of its own folder or
of a lower floor. Folders on one floor are siblings that know nothing of
each other. A strict order leaves no room for a cycle.

The daemon includes nothing of the client library (its routes are
connections of its workers, docs/cluster.md). The client library has one
rule of its own: its transports see their session only through SessionSide
(client-lib/src/transport.hpp), never the Session or its parts.

Reads the `#include "..."` lines; prints each include that runs up or
sideways, and any folder without a floor; exits 1 if there is one."""
import os
import re
import sys

# Bottom to top. A new folder gets a floor here and a line in
# docs/architecture.md's table before it can land.
FLOORS = [
    ["fault"],                    # test builds' fault injection: below everything it hooks into
    ["broker", "store"],          # the shared core: pool, index, auth, admission, budgets, interfaces;
                                  # and a stream's messages on disk (knows nothing of the broker)
    ["connection"],               # a client connection, its out-queue and its subscriptions
    ["router"],                   # a publish to the subscribers' out-queues
    ["frames"],                   # a received frame, decoded and handled
    ["rdma", "tcp"],              # the transports: ports and links
    ["worker"],                   # the reactor: a loop driving its ports and connections
    ["accept", "multicast", "cluster", "stream"],  # engines beside the workers: command queues, interfaces
    ["server"],                   # daemon/server.*: the composition root
    ["ops"],                      # the operator's side: metrics, admin socket, reload, logging
    ["main"],                     # daemon/main.cpp
]
FLOOR = {folder: i for i, folders in enumerate(FLOORS) for folder in folders}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def folder_of(path):
    """The folder of a path relative to daemon/; top-level files are their own."""
    head, _, rest = path.partition("/")
    if rest:
        return head
    return os.path.splitext(head)[0]


# The client library's public headers: nothing of the daemon includes them.
CLIENT_LIBRARY = ["rdmabroker/client.hpp", "rdmabroker/rdmabroker.h"]
# client-lib/src: the transports, and what they must not include.
CLIENT_TRANSPORTS = ["rdma_transport.hpp", "rdma_transport.cpp", "rdma_multicast.cpp", "tcp_transport.cpp"]
SESSION_ONLY = ["session.hpp", "send_buffers.hpp", "subscriptions.hpp", "requests.hpp", "reassembly.hpp",
                "multicast_streams.hpp"]


def includes(path):
    """(line number, included path) of each `#include "..."` of a file."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if m:
                yield number, m.group(1)


def client_transports(root):
    bad = []
    src = os.path.join(root, "client-lib", "src")
    for name in CLIENT_TRANSPORTS:
        for number, header in includes(os.path.join(src, name)):
            if header in SESSION_ONLY:
                bad.append(f"client-lib/src/{name}:{number}: a transport includes {header} "
                           "(it sees its session as a SessionSide: transport.hpp)")
    return bad


def main(root):
    daemon = os.path.join(root, "daemon")
    bad = []
    for dirpath, _, files in os.walk(daemon):
        for name in sorted(files):
            if not name.endswith((".cpp", ".hpp", ".h")):
                continue
            path = os.path.relpath(os.path.join(dirpath, name), daemon)
            src = folder_of(path)
            if src not in FLOOR:
                bad.append(f"daemon/{path}: folder '{src}' has no floor in tests/lint/layers.py")
                continue
            for number, header in includes(os.path.join(daemon, path)):
                if header in CLIENT_LIBRARY:
                    bad.append(f"daemon/{path}:{number}: includes {header}: the daemon does not use "
                               "the client library")
                    continue
                if not os.path.exists(os.path.join(daemon, header)):
                    continue  # another library's header (rdmabroker/..., config/...)
                dst = folder_of(header)
                if dst == src:
                    continue
                if dst not in FLOOR:
                    bad.append(f"daemon/{path}:{number}: includes {header}, folder without a floor")
                elif FLOOR[dst] >= FLOOR[src]:
                    how = "up" if FLOOR[dst] > FLOOR[src] else "sideways"
                    bad.append(f"daemon/{path}:{number}: {src} includes {header} ({how}: "
                               f"{src} is floor {FLOOR[src]}, {dst} floor {FLOOR[dst]})")
    bad += client_transports(root)
    for line in bad:
        print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
