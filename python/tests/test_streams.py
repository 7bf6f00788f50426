# SPDX-License-Identifier: Apache-2.0
"""Stream consumers from Python (docs/streams.md): push and pull, acks and
NAKs, a durable consumer that resumes, asyncio; over the transport the
suite runs on (RDMABROKER_TEST_VIA)."""

import asyncio

import pytest

import rdmabroker
import rdmabroker.aio


def _orders(make_broker, tmp_path):
    return make_broker(f"storage: {{directory: {tmp_path}}}\nstreams: [{{name: ORDERS, subjects: [\"orders.>\"]}}]\n")


def test_a_consumer_reads_acks_and_resumes_where_its_durable_name_stands(make_broker, tmp_path):
    b = _orders(make_broker, tmp_path)
    with rdmabroker.connect(b.url(), bind=b.bind) as c:
        for i in range(1, 6):
            c.publish_acked(f"orders.{i}", f"m{i}")
        with c.consume("ORDERS", durable="py") as k:
            assert k.pending_at_open == 5
            first = k.next(timeout=10)
            assert (first.stream_sequence, first.deliveries, first.data) == (1, 1, b"m1")
            k.ack(first)
            second = k.next(timeout=10)
            k.nak(second)  # not done: it comes again
            again = [m for m in k.messages(timeout=1)]
            assert (again[-1].stream_sequence, again[-1].deliveries) == (2, 2)
            for m in again:
                k.ack(m)
            with pytest.raises(rdmabroker.InvalidArgument):
                k.ack(first)  # answered already
        c.flush()
        c.publish_acked("orders.6", "m6")
        with c.consume("ORDERS", durable="py") as k:
            assert [m.data for m in k.messages(timeout=1)] == [b"m6"]
        with pytest.raises(rdmabroker.NoStream):
            c.consume("NOPE")
        with pytest.raises(rdmabroker.ConsumerInvalid):
            c.consume("ORDERS", durable="py", ack="none")


def test_a_pull_consumer_fetches_and_asyncio_consumes(make_broker, tmp_path):
    b = _orders(make_broker, tmp_path)
    with rdmabroker.connect(b.url(), bind=b.bind) as c:
        for i in range(1, 8):
            c.publish_acked("orders.x", f"m{i}")
        with c.consume("ORDERS", pull=True, ack="none") as k:
            assert [m.stream_sequence for m in k.fetch(3, timeout=5)] == [1, 2, 3]
            assert [m.stream_sequence for m in k.fetch(10, timeout=0.5)] == [4, 5, 6, 7]

    async def main():
        async with await rdmabroker.aio.connect(b.url(), bind=b.bind) as a:
            async with await a.consume("ORDERS", start="last_per_subject") as k:
                m = await k.next(timeout=10)
                await k.ack(m)
                return m.stream_sequence, m.data

    assert asyncio.run(main()) == (7, b"m7")
