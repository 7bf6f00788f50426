# SPDX-License-Identifier: Apache-2.0
"""The asyncio form (rdmabroker.aio) against a real broker (conftest.py)."""

import asyncio

import pytest

import rdmabroker
import rdmabroker.aio


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 60))


def test_publish_subscribe_and_async_iteration(broker):
    async def main():
        async with await rdmabroker.aio.connect(broker.url(), bind=broker.bind) as client:
            info = client.server_info()
            assert (info.broker.id, info.peers, info.client_urls) == ("", [], []), "not in a cluster"
            sub = await client.subscribe("aio.it.>")
            await client.flush()
            with pytest.raises(rdmabroker.Timeout):
                await sub.next(timeout=0.1)
            for i in range(50):
                await client.publish(f"aio.it.{i}", str(i))
            first = await sub.next(timeout=10)
            assert (first.subject, first.data) == ("aio.it.0", b"0")
            rest = []
            async for m in sub:
                rest.append(int(m.data))
                if len(rest) == 49:
                    break
            assert rest == list(range(1, 50))

    run(main())


def test_request_reply_with_an_async_responder(broker):
    async def main():
        async with await rdmabroker.aio.connect(broker.url(), bind=broker.bind) as responder, \
                await rdmabroker.aio.connect(broker.url(), bind=broker.bind) as client:
            requests = await responder.subscribe("aio.svc", queue="responders")
            await responder.flush()

            async def serve():
                async for m in requests:
                    await responder.publish(m.reply, b"re:" + m.data)

            task = asyncio.create_task(serve())
            replies = await asyncio.gather(*(client.request("aio.svc", str(i), timeout=10) for i in range(5)))
            assert sorted(r.data for r in replies) == [f"re:{i}".encode() for i in range(5)]
            with pytest.raises(rdmabroker.NoResponders):
                await client.request("aio.nobody", b"x", timeout=10)
            responder.close()
            await asyncio.wait_for(task, 10)  # its iteration ended with the close

    run(main())


def test_close_ends_iteration_and_later_calls_raise_closed(broker):
    async def main():
        client = await rdmabroker.aio.connect(broker.url(), bind=broker.bind)
        sub = await client.subscribe("aio.end")
        ended = asyncio.create_task(sub.next())
        await asyncio.sleep(0.05)
        client.close()
        with pytest.raises(rdmabroker.Closed):
            await ended
        with pytest.raises(rdmabroker.Closed):
            await client.publish("aio.end", b"x")
        assert [m async for m in sub] == []

    run(main())


def test_publish_acked_from_asyncio(make_broker, tmp_path):
    b = make_broker(f"storage: {{directory: {tmp_path}}}\nstreams: [{{name: S, subjects: [s]}}]\n")

    async def main():
        async with await rdmabroker.aio.connect(b.url(), bind=b.bind) as c:
            return await c.publish_acked("s", b"x")

    assert asyncio.run(main()) == rdmabroker.PubAck("S", 1, False)
