# SPDX-License-Identifier: Apache-2.0
"""Stream consumers (docs/streams.md, "Consumers"): Client.consume() makes
one, over librdmabroker's rb_consume.

    with client.consume("ORDERS", durable="billing") as orders:
        for m in orders.messages(timeout=1):
            handle(m)
            orders.ack(m)
"""

import ctypes
from typing import Iterator, List, Optional

from . import _check, _CMessage, _lib, _message, _ms, InvalidArgument, Message, Timeout, Closed

START = {"all": 0, "new": 1, "last": 2, "last_per_subject": 3, "sequence": 4, "time": 5}
ACK = {"none": 0, "explicit": 1, "cumulative": 2}


class _COptions(ctypes.Structure):
    _fields_ = [("durable", ctypes.c_char_p), ("start", ctypes.c_int), ("start_sequence", ctypes.c_uint64),
                ("start_time_ns", ctypes.c_int64), ("ack", ctypes.c_int), ("ack_wait_ms", ctypes.c_int),
                ("max_deliver", ctypes.c_uint32), ("max_ack_pending", ctypes.c_uint32), ("pull", ctypes.c_int),
                ("original_pace", ctypes.c_int)]


_P, _I = ctypes.c_void_p, ctypes.c_int
_MSG_PP = ctypes.POINTER(ctypes.POINTER(_CMessage))
for _name, _res, _args in [
    ("rb_consumer_options_init", None, [ctypes.POINTER(_COptions)]),
    ("rb_consume", _I, [_P, ctypes.c_char_p, ctypes.POINTER(_COptions), _I, ctypes.POINTER(_P),
                        ctypes.POINTER(ctypes.c_uint64)]),
    ("rb_consumer_next", _I, [_P, _I, _MSG_PP]),
    ("rb_consumer_fetch", _I, [_P, ctypes.c_size_t, _I, _MSG_PP, ctypes.POINTER(ctypes.c_size_t)]),
    ("rb_consumer_ack", _I, [_P, ctypes.POINTER(_CMessage)]),
    ("rb_consumer_nak", _I, [_P, ctypes.POINTER(_CMessage)]),
    ("rb_consumer_close", None, [_P]),
]:
    getattr(_lib, _name).restype, getattr(_lib, _name).argtypes = _res, _args


class Consumer:
    """A consumer of a stream; Client.consume() opens one. Push: read with
    next() or messages(); pull: fetch(). Acknowledge with ack() (unless
    ack="none"); nak() asks for a message again. A context manager that
    leaves the consumer (a durable one stays on the broker)."""

    def __init__(self, client, stream: str, *, durable: str = "", start: str = "all",
                 start_sequence: int = 0, start_time: Optional[float] = None, ack: str = "explicit",
                 ack_wait: float = 30.0, max_deliver: int = 0, max_ack_pending: int = 1024, pull: bool = False,
                 original_pace: bool = False, timeout: float = 10.0):
        if start not in START or ack not in ACK:
            raise InvalidArgument(f"start is one of {sorted(START)}, ack one of {sorted(ACK)}", -1)
        o = _COptions()
        _lib.rb_consumer_options_init(ctypes.byref(o))
        o.durable = durable.encode() if durable else None
        o.start, o.ack = START[start], ACK[ack]
        o.start_sequence = start_sequence
        o.start_time_ns = int((start_time or 0) * 1e9)
        o.ack_wait_ms, o.max_deliver, o.max_ack_pending = _ms(ack_wait), max_deliver, max_ack_pending
        o.pull, o.original_pace = int(pull), int(original_pace)
        handle, pending = ctypes.c_void_p(), ctypes.c_uint64()
        _check(_lib.rb_consume(client._h(), stream.encode(), ctypes.byref(o), _ms(timeout), ctypes.byref(handle),
                               ctypes.byref(pending)))
        self._client = client  # the consumer needs its client open
        self._handle = handle
        self._messages = {}  # stream_sequence -> the C message, for ack() and nak()
        self._ack_none = ack == "none"
        self.stream = stream
        self.pending_at_open = pending.value

    def _take(self, c_message) -> Message:
        m = _message(c_message.contents)
        if self._ack_none:
            _lib.rb_message_free(c_message)  # nothing will answer for it
        else:
            self._messages[m.stream_sequence] = c_message  # kept for ack() or nak()
        return m

    def next(self, timeout: Optional[float] = None) -> Message:
        """A push consumer's next message; Timeout if none comes in time."""
        out = ctypes.POINTER(_CMessage)()
        remaining = None if timeout is None else float(timeout)
        while True:  # in slices: Ctrl-C interrupts a long wait
            piece = 0.2 if remaining is None else min(remaining, 0.2)
            status = _lib.rb_consumer_next(self._h(), _ms(piece), ctypes.byref(out))
            if status == 0:
                return self._take(out)
            if status != -4 or (remaining is not None and remaining <= piece):
                _check(status)
            if remaining is not None:
                remaining -= piece

    def messages(self, timeout: Optional[float] = None) -> Iterator[Message]:
        """Messages as they come; stops when none came for `timeout` seconds."""
        while True:
            try:
                yield self.next(timeout)
            except (Timeout, Closed):
                return

    def fetch(self, count: int, timeout: float = 5.0) -> List[Message]:
        """A pull consumer: up to `count` messages, those that came within `timeout`."""
        out = (ctypes.POINTER(_CMessage) * max(count, 1))()
        got = ctypes.c_size_t()
        _check(_lib.rb_consumer_fetch(self._h(), count, _ms(timeout), out, ctypes.byref(got)))
        return [self._take(out[i]) for i in range(got.value)]

    def ack(self, m: Message) -> None:
        """Acknowledges `m` (ack="cumulative": and every earlier one)."""
        self._answer(_lib.rb_consumer_ack, m)

    def nak(self, m: Message) -> None:
        """Not done with `m`: deliver it again now."""
        self._answer(_lib.rb_consumer_nak, m)

    def _answer(self, f, m: Message) -> None:
        c_message = self._messages.pop(m.stream_sequence, None)
        if c_message is None:
            raise InvalidArgument("not a message of this consumer awaiting an answer", -1)
        try:
            _check(f(self._h(), c_message))
        finally:
            _lib.rb_message_free(c_message)

    def close(self) -> None:
        """Leaves the consumer: what it did not acknowledge goes to another member or waits."""
        handle, self._handle = self._handle, None
        if handle is not None:
            for c_message in self._messages.values():
                _lib.rb_message_free(c_message)
            self._messages.clear()
            _lib.rb_consumer_close(handle)

    def _h(self):
        if self._handle is None:
            raise Closed("the consumer is closed", -5)
        return self._handle

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

