# SPDX-License-Identifier: Apache-2.0
"""The asyncio form of the rdmabroker client: the same client, awaited.

    import asyncio
    import rdmabroker.aio

    async def main():
        async with await rdmabroker.aio.connect("tcp://127.0.0.1:7471") as client:
            sub = await client.subscribe("orders.>")
            await client.publish("orders.eu", b"hello")
            print((await sub.next(timeout=5)).data)
            async for msg in sub:           # until the client closes
                ...

    asyncio.run(main())

Calls that can wait (connect, publish, request, flush) run in the loop's
default executor, so the event loop never blocks on the library; messages
come from the library's thread to the loop with call_soon_threadsafe. The
options of connect() and the exceptions are those of rdmabroker
(docs/python.md).
"""

import asyncio
from typing import AsyncIterator, Optional, Union

from typing import List

from . import Client, Closed, Consumer, Headers, Message, PubAck, ServerInfo, Timeout

_END = object()  # put in a subscription's queue when the client closes


class AsyncSubscription:
    """Messages of a subscription, delivered into the event loop."""

    def __init__(self, client: "AsyncClient", subject: str, queue: str):
        self._client = client
        self._queue: "asyncio.Queue" = asyncio.Queue()
        loop = client._loop

        def deliver(msg: Message) -> None:  # the library's thread
            if not loop.is_closed():
                loop.call_soon_threadsafe(self._queue.put_nowait, msg)

        self._sub = client._client.subscribe(subject, callback=deliver, queue=queue)
        self.sid = self._sub.sid
        self._ended = False

    async def next(self, timeout: Optional[float] = None) -> Message:
        """The next message; rdmabroker.Timeout if none within `timeout`
        seconds (None: wait); Closed once the client has closed."""
        if self._ended:
            raise Closed("the subscription has ended", -5)
        try:
            item = await asyncio.wait_for(self._queue.get(), timeout)
        except asyncio.TimeoutError:
            raise Timeout(f"no message within {timeout} s", -4) from None
        if item is _END:
            self._ended = True
            raise Closed("the client closed", -5)
        return item

    def __aiter__(self) -> AsyncIterator[Message]:
        return self

    async def __anext__(self) -> Message:
        try:
            return await self.next()
        except Closed:
            raise StopAsyncIteration from None

    def unsubscribe(self) -> None:
        self._sub.unsubscribe()
        self._end()

    def _end(self) -> None:
        self._queue.put_nowait(_END)


class AsyncConsumer:
    """A stream's consumer (rdmabroker.Consumer) for asyncio code: each call
    that waits runs in the loop's executor."""

    def __init__(self, client: "AsyncClient", consumer: Consumer):
        self._client = client
        self._consumer = consumer
        self.pending_at_open = consumer.pending_at_open

    async def next(self, timeout: Optional[float] = None) -> Message:
        return await self._client._run(self._consumer.next, timeout)

    async def fetch(self, count: int, timeout: float = 5.0) -> List[Message]:
        return await self._client._run(self._consumer.fetch, count, timeout)

    async def ack(self, m: Message) -> None:
        await self._client._run(self._consumer.ack, m)

    async def nak(self, m: Message) -> None:
        await self._client._run(self._consumer.nak, m)

    def __aiter__(self) -> AsyncIterator[Message]:
        return self

    async def __anext__(self) -> Message:
        try:
            return await self.next()
        except Closed:
            raise StopAsyncIteration from None

    def close(self) -> None:
        self._consumer.close()

    async def __aenter__(self) -> "AsyncConsumer":
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()


class AsyncClient:
    """A connection to rdmabrokerd for asyncio code; use `await connect()`."""

    def __init__(self, client: Client, loop: asyncio.AbstractEventLoop):
        self._client = client
        self._loop = loop
        self._subs = []

    async def _run(self, f, *args):
        return await self._loop.run_in_executor(None, f, *args)

    async def publish(self, subject: str, data: Union[bytes, str] = b"", reply: str = "",
                      headers: Optional[Headers] = None) -> None:
        await self._run(self._client.publish, subject, data, reply, headers)

    async def publish_acked(self, subject: str, data: Union[bytes, str] = b"", timeout: float = 5.0,
                            headers: Optional[Headers] = None) -> PubAck:
        return await self._run(self._client.publish_acked, subject, data, timeout, headers)

    async def request(self, subject: str, data: Union[bytes, str] = b"", timeout: float = 5.0,
                      headers: Optional[Headers] = None) -> Message:
        return await self._run(self._client.request, subject, data, timeout, headers)

    async def flush(self, timeout: float = 10.0) -> None:
        await self._run(self._client.flush, timeout)

    async def subscribe(self, subject: str, queue: str = "") -> AsyncSubscription:
        sub = AsyncSubscription(self, subject, queue)
        self._subs.append(sub)
        return sub

    async def consume(self, stream: str, **options) -> AsyncConsumer:
        """Client.consume(), awaited; the same options."""
        return AsyncConsumer(self, await self._run(lambda: self._client.consume(stream, **options)))

    def server_info(self) -> ServerInfo:
        """The last INFO the broker sent (Client.server_info; no waiting)."""
        return self._client.server_info()

    def close(self) -> None:
        """Closes the connection; every subscription's iteration ends."""
        self._client.close()
        for sub in self._subs:
            sub._end()
        self._subs.clear()

    @property
    def closed(self) -> bool:
        return self._client.closed

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()


async def connect(url: str, bind: Optional[str] = None, **options) -> AsyncClient:
    """rdmabroker.connect(), awaited; the same options."""
    loop = asyncio.get_running_loop()
    client = await loop.run_in_executor(None, lambda: Client(url, bind, **options))
    return AsyncClient(client, loop)
