# SPDX-License-Identifier: Apache-2.0
"""rdmabroker: a Python client of rdmabrokerd over librdmabroker's C API.

    import rdmabroker

    with rdmabroker.connect("rdma://10.0.0.1:7470") as client:
        sub = client.subscribe("orders.>")
        client.publish("orders.eu", b"hello")
        print(sub.next(timeout=5).data)

Credentials go in the URL ("rdma://user:password@host", "tcp://token@host").
Errors are exceptions: rdmabroker.Error and one subclass per kind of the
library (Timeout, NoResponders, PermissionDenied, ...). docs/python.md has
the whole guide.

The library is loaded from RDMABROKER_LIBRARY if set (a build tree), else as
librdmabroker.so.0 from the system (the installed package).
"""

import collections.abc
import ctypes
import os
import sys
import threading
import traceback
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, List, Mapping, NamedTuple, Optional, Tuple, Union

__version__ = "0.1.0"  # the project's version (CMakeLists.txt; a test keeps them equal)

__all__ = [
    "__version__", "connect", "Client", "Subscription", "Message", "Headers", "ServerInfo", "BrokerInfo", "Error", "InvalidArgument", "ConnectFailed",
    "Rejected", "Timeout", "Closed", "BrokerError", "ResourceError", "PayloadTooLarge",
    "NoResponders", "AuthenticationFailed", "PermissionDenied", "MessagesLost", "NoStream", "StreamFull",
    "DiskFull", "PubAck", "Consumer", "ConsumerInvalid",
]

# ---------------------------------------------------------------- errors (errors.py)

from .errors import (  # noqa: E402
    _ERRORS, AuthenticationFailed, BrokerError, Closed, ConnectFailed, DiskFull, Error, InvalidArgument,
    MessagesLost, NoResponders, NoStream, PayloadTooLarge, PermissionDenied, Rejected, ResourceError,
    StreamFull, Timeout, ConsumerInvalid,
)


class PubAck(NamedTuple):
    """What a stream said about an acknowledged publish (docs/streams.md)."""
    stream: str
    sequence: int
    duplicate: bool


class _CPubAck(ctypes.Structure):
    _fields_ = [("stream", ctypes.c_char * 65), ("sequence", ctypes.c_uint64), ("duplicate", ctypes.c_int)]

# ---------------------------------------------------------------- the C API


class _CHeader(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_char_p)]


class _CMessage(ctypes.Structure):
    _fields_ = [("sid", ctypes.c_uint32), ("subject", ctypes.c_char_p), ("reply", ctypes.c_char_p),
                ("data", ctypes.c_void_p), ("len", ctypes.c_size_t), ("owner_", ctypes.c_void_p),
                ("headers", ctypes.POINTER(_CHeader)), ("header_count", ctypes.c_size_t),
                ("stream_sequence", ctypes.c_uint64), ("deliveries", ctypes.c_uint32)]


class _CBrokerInfo(ctypes.Structure):
    _fields_ = [("id", ctypes.c_char_p), ("urls", ctypes.POINTER(ctypes.c_char_p)), ("url_count", ctypes.c_size_t),
                ("routes", ctypes.POINTER(ctypes.c_char_p)), ("route_count", ctypes.c_size_t)]


class _CServerInfo(ctypes.Structure):
    _fields_ = [("self", _CBrokerInfo), ("cluster", ctypes.c_char_p), ("peers", ctypes.POINTER(_CBrokerInfo)),
                ("peer_count", ctypes.c_size_t), ("client_urls", ctypes.POINTER(ctypes.c_char_p)),
                ("client_url_count", ctypes.c_size_t), ("owner_", ctypes.c_void_p)]


_MESSAGE_CB = ctypes.CFUNCTYPE(None, ctypes.POINTER(_CMessage), ctypes.c_void_p)
_SERVER_INFO_CB = ctypes.CFUNCTYPE(None, ctypes.POINTER(_CServerInfo), ctypes.c_void_p)
_ERROR_CB = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_CONNECTION_CB = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


class _COptions(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("bind_address", ctypes.c_char_p), ("user", ctypes.c_char_p),
                ("password", ctypes.c_char_p), ("token", ctypes.c_char_p), ("reconnect", ctypes.c_int),
                ("max_reconnect_attempts", ctypes.c_int), ("connect_timeout_ms", ctypes.c_int),
                ("publish_timeout_ms", ctypes.c_int), ("reconnect_delay_ms", ctypes.c_int),
                ("reconnect_max_delay_ms", ctypes.c_int), ("on_error", _ERROR_CB),
                ("on_error_user", ctypes.c_void_p), ("on_connection_event", _CONNECTION_CB),
                ("on_connection_event_user", ctypes.c_void_p), ("tls_ca_file", ctypes.c_char_p),
                ("tls_cert_file", ctypes.c_char_p), ("tls_key_file", ctypes.c_char_p),
                ("tls_server_name", ctypes.c_char_p),
                # rb_options_init_sized is told this struct's size; fields the
                # library added later keep their defaults.
                ("polled", ctypes.c_int), ("adaptive_poll", ctypes.c_int),
                ("ignore_announced_servers", ctypes.c_int), ("on_server_info", _SERVER_INFO_CB),
                ("on_server_info_user", ctypes.c_void_p), ("no_rendezvous", ctypes.c_int)]

# rb_connection_event -> the name a callback is given.
_CONNECTION_EVENTS = {0: "disconnected", 1: "reconnected", 2: "gave_up"}


_LIBRARY_PACKAGE = "librdmabroker0"  # the Debian package that ships librdmabroker.so.0


def _load():
    name = os.environ.get("RDMABROKER_LIBRARY") or "librdmabroker.so.0"
    try:
        lib = ctypes.CDLL(name)
    except OSError as e:
        where = ("RDMABROKER_LIBRARY=" + name if os.environ.get("RDMABROKER_LIBRARY")
                 else name + " from the system's library path")
        raise ImportError(
            f"rdmabroker: cannot load the client library {where} ({e}). Install the Debian package "
            f"{_LIBRARY_PACKAGE} (apt-get install {_LIBRARY_PACKAGE}), or set RDMABROKER_LIBRARY to the path of "
            f"librdmabroker.so.0 (a build tree: build/release/client-lib/librdmabroker.so.0).",
            name="rdmabroker") from e
    P, I, U32, S = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_size_t
    msg_pp = ctypes.POINTER(ctypes.POINTER(_CMessage))
    for name, res, args in [
        ("rb_connect_with", I, [ctypes.c_char_p, ctypes.POINTER(_COptions), ctypes.POINTER(P)]),
        ("rb_options_init_sized", None, [ctypes.POINTER(_COptions), ctypes.c_size_t]),
        ("rb_publish", I, [P, ctypes.c_char_p, ctypes.c_char_p, S]),
        ("rb_publish_request", I, [P, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, S]),
        ("rb_request", I, [P, ctypes.c_char_p, ctypes.c_char_p, S, I, msg_pp]),
        ("rb_publish_headers", I, [P, ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(_CHeader), S,
                                   ctypes.c_char_p, S]),
        ("rb_request_headers", I, [P, ctypes.c_char_p, ctypes.POINTER(_CHeader), S, ctypes.c_char_p, S, I,
                                   msg_pp]),
        ("rb_publish_acked", I, [P, ctypes.c_char_p, ctypes.POINTER(_CHeader), S, ctypes.c_char_p, S, I,
                                 ctypes.POINTER(_CPubAck)]),
        ("rb_queue_subscribe", I, [P, ctypes.c_char_p, ctypes.c_char_p, _MESSAGE_CB, P, ctypes.POINTER(U32)]),
        ("rb_queue_subscribe_sync", I, [P, ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(P)]),
        ("rb_next_message", I, [P, I, msg_pp]),
        ("rb_message_free", None, [ctypes.POINTER(_CMessage)]),
        ("rb_subscription_sid", U32, [P]),
        ("rb_subscription_free", None, [P]),
        ("rb_unsubscribe", I, [P, U32]),
        ("rb_flush", I, [P, I]),
        ("rb_server_info_get", I, [P, ctypes.POINTER(ctypes.POINTER(_CServerInfo))]),
        ("rb_server_info_free", None, [ctypes.POINTER(_CServerInfo)]),
        ("rb_close", None, [P]),
        ("rb_last_error", ctypes.c_char_p, []),
    ]:
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    return lib


_lib = _load()


def _check(status: int) -> None:
    if status != 0:
        # rb_last_error is the calling thread's: read it before anything else runs here.
        message = (_lib.rb_last_error() or b"").decode("utf-8", "replace")
        raise _ERRORS.get(status, Error)(message, status)


def _ms(timeout: Optional[float]) -> int:
    if timeout is None:
        return 2 ** 31 - 1
    if timeout < 0:
        raise InvalidArgument("timeout must not be negative", -1)
    return int(timeout * 1000)


def _guarded(f, *args) -> None:
    """Runs an application callback on the library's thread: an exception
    it raises is printed, and the library goes on."""
    try:
        f(*args)
    except Exception:
        traceback.print_exc(file=sys.stderr)


def _bytes(data: Union[bytes, bytearray, memoryview, str]) -> bytes:
    return data.encode() if isinstance(data, str) else bytes(data)


# ---------------------------------------------------------------- messages


# Header values are text; bytes that are not UTF-8 survive a round trip.
_TEXT = ("utf-8", "surrogateescape")


@dataclass(frozen=True)
class Message:
    subject: str
    data: bytes
    reply: str = ""  # where a responder answers; "" when the publisher wants no answer
    sid: int = 0     # the subscription that received it
    headers: Tuple[Tuple[str, str], ...] = ()  # (name, value) fields in order; () when none were sent
    stream_sequence: int = 0  # from a stream's consumer: its sequence there (0: not from one)
    deliveries: int = 0       # ... and how many times it was delivered, this one included

    def header(self, name: str) -> Optional[str]:
        """The first value of header `name` (compared without regard to
        ASCII case), or None."""
        wanted = name.lower()
        for n, v in self.headers:
            if n.lower() == wanted:
                return v
        return None


def _message(m: "_CMessage") -> Message:
    data = ctypes.string_at(m.data, m.len) if m.len else b""
    headers = tuple((m.headers[i].name.decode(*_TEXT), m.headers[i].value.decode(*_TEXT))
                    for i in range(m.header_count))
    return Message(m.subject.decode(), data, (m.reply or b"").decode(), m.sid, headers, m.stream_sequence,
                   m.deliveries)


Headers = Union[Mapping[str, str], Iterable[Tuple[str, str]]]


def _c_headers(headers: Headers):
    """(array, count) for the C API: a mapping's items or (name, value) pairs, in order."""
    pairs = list(headers.items() if isinstance(headers, collections.abc.Mapping) else headers)
    array = (_CHeader * len(pairs))(*[_CHeader(n.encode(*_TEXT), v.encode(*_TEXT)) for n, v in pairs])
    return array, len(pairs)


# ---------------------------------------------------------------- subscriptions


@dataclass(frozen=True)
class BrokerInfo:
    """A broker of a cluster as an INFO names it."""
    id: str                # random at each start of that broker
    urls: List[str]        # where clients reach it
    routes: List[str]      # where other brokers' routes reach it


@dataclass(frozen=True)
class ServerInfo:
    """What the broker of a cluster says about itself and the brokers it has
    routes up to (docs/cluster.md). `broker.id` is "" before any INFO, or
    when the broker is not in a cluster."""
    broker: BrokerInfo       # the one this client is connected to
    cluster: str
    peers: List[BrokerInfo]
    client_urls: List[str]   # every client URL announced: the broker's, then its peers', once each


def _strings(array, count: int) -> List[str]:
    return [array[i].decode() for i in range(count)]


def _broker_info(b: "_CBrokerInfo") -> BrokerInfo:
    return BrokerInfo((b.id or b"").decode(), _strings(b.urls, b.url_count), _strings(b.routes, b.route_count))


def _server_info(i: "_CServerInfo") -> ServerInfo:
    return ServerInfo(_broker_info(i.self), (i.cluster or b"").decode(),
                      [_broker_info(i.peers[k]) for k in range(i.peer_count)],
                      _strings(i.client_urls, i.client_url_count))


class Subscription:
    """A subscription. Made with a callback, messages go to it on the
    library's thread; without one, they wait in a queue for next() or
    iteration."""

    def __init__(self, client: "Client", sid: int, handle=None, callback=None):
        self._client = client
        self.sid = sid
        self._handle = handle      # rb_subscription*, for next()
        self._callback = callback  # the ctypes function object, kept alive while subscribed

    def next(self, timeout: Optional[float] = None) -> Message:
        """The next message; Timeout if none comes within `timeout` seconds
        (None: wait as long as it takes); Closed once the subscription or the
        client has ended."""
        if self._handle is None:
            raise InvalidArgument("a subscription with a callback has no queue to read", -1)
        out = ctypes.POINTER(_CMessage)()
        # Waiting in slices lets Ctrl-C interrupt a long wait.
        remaining = None if timeout is None else float(timeout)
        while True:
            piece = 0.2 if remaining is None else min(remaining, 0.2)
            status = _lib.rb_next_message(self._handle, _ms(piece), ctypes.byref(out))
            if status == 0:
                try:
                    return _message(out.contents)
                finally:
                    _lib.rb_message_free(out)
            if status != -4 or (remaining is not None and remaining <= piece):
                _check(status)
            if remaining is not None:
                remaining -= piece

    def messages(self, timeout: Optional[float] = None) -> Iterator[Message]:
        """Messages as they come; stops when none came for `timeout` seconds
        (None: never) or the subscription ended."""
        while True:
            try:
                yield self.next(timeout)
            except (Timeout, Closed):
                return

    def __iter__(self) -> Iterator[Message]:
        return self.messages()

    def unsubscribe(self) -> None:
        """Stops the deliveries (the broker is told) and frees the queue."""
        if self._client._handle is not None and self.sid:
            _check(_lib.rb_unsubscribe(self._client._handle, self.sid))
        self._release()

    def _release(self) -> None:
        if self._handle is not None:
            _lib.rb_subscription_free(self._handle)
            self._handle = None
        self._client._callbacks.pop(self.sid, None)
        self.sid = 0

    def __del__(self):
        # The queue's memory only: an unsubscribe needs the client, which may be gone.
        if getattr(self, "_handle", None) is not None:
            _lib.rb_subscription_free(self._handle)
            self._handle = None

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc) -> None:
        if self.sid:
            try:
                self.unsubscribe()
            except Closed:
                self._release()


# ---------------------------------------------------------------- the client


class Client:
    """A connection to rdmabrokerd; use connect(). Thread-safe, as the C++
    client is; a context manager that closes it."""

    def __init__(self, url: str, bind: Optional[str] = None, *, user: Optional[str] = None,
                 password: Optional[str] = None, token: Optional[str] = None, reconnect: bool = False,
                 max_reconnect_attempts: int = 0, connect_timeout: Optional[float] = None,
                 publish_timeout: Optional[float] = None, reconnect_delay: Optional[float] = None,
                 reconnect_max_delay: Optional[float] = None, tls_ca: Optional[str] = None,
                 tls_cert: Optional[str] = None, tls_key: Optional[str] = None,
                 tls_server_name: Optional[str] = None,
                 on_error: Optional[Callable[["Error"], None]] = None,
                 on_connection_event: Optional[Callable[[str, str], None]] = None,
                 ignore_announced_servers: bool = False,
                 on_server_info: Optional[Callable[["ServerInfo"], None]] = None,
                 rendezvous: bool = True):
        o = _COptions()
        _lib.rb_options_init_sized(ctypes.byref(o), ctypes.sizeof(o))
        text = lambda v: v.encode() if v else None  # noqa: E731
        o.bind_address, o.user, o.password, o.token = text(bind), text(user), text(password), text(token)
        o.tls_ca_file, o.tls_cert_file, o.tls_key_file = text(tls_ca), text(tls_cert), text(tls_key)
        o.tls_server_name = text(tls_server_name)
        o.reconnect = int(bool(reconnect))
        o.ignore_announced_servers = int(bool(ignore_announced_servers))
        o.no_rendezvous = int(not rendezvous)
        o.max_reconnect_attempts = max_reconnect_attempts
        for field, seconds in (("connect_timeout_ms", connect_timeout), ("publish_timeout_ms", publish_timeout),
                               ("reconnect_delay_ms", reconnect_delay),
                               ("reconnect_max_delay_ms", reconnect_max_delay)):
            if seconds is not None:
                setattr(o, field, max(1, _ms(seconds)))
        # The C callbacks live as long as the client: the library may call them until close().
        self._c_on_error = self._c_on_connection_event = self._c_on_server_info = None
        if on_error is not None:
            def error(status, message, _user):
                _guarded(on_error, _ERRORS.get(status, Error)((message or b"").decode("utf-8", "replace"), status))
            self._c_on_error = o.on_error = _ERROR_CB(error)
        if on_connection_event is not None:
            def event(kind, reason, _user):
                _guarded(on_connection_event, _CONNECTION_EVENTS.get(kind, str(kind)),
                         (reason or b"").decode("utf-8", "replace"))
            self._c_on_connection_event = o.on_connection_event = _CONNECTION_CB(event)
        if on_server_info is not None:
            def info(c_info, _user):
                _guarded(on_server_info, _server_info(c_info.contents))
            self._c_on_server_info = o.on_server_info = _SERVER_INFO_CB(info)
        handle = ctypes.c_void_p()
        _check(_lib.rb_connect_with(url.encode(), ctypes.byref(o), ctypes.byref(handle)))
        self._handle = handle
        self._callbacks = {}
        self._lock = threading.Lock()

    def _h(self):
        if self._handle is None:
            raise Closed("the client is closed", -5)
        return self._handle

    def publish(self, subject: str, data: Union[bytes, str] = b"", reply: str = "",
                headers: Optional[Headers] = None) -> None:
        """Publishes; returns once the library has the message (flush() waits
        for the broker). `headers`: a dict or (name, value) pairs
        (docs/headers.md)."""
        payload = _bytes(data)
        if headers:
            array, count = _c_headers(headers)
            _check(_lib.rb_publish_headers(self._h(), subject.encode(), reply.encode() if reply else None,
                                           array, count, payload, len(payload)))
        elif reply:
            _check(_lib.rb_publish_request(self._h(), subject.encode(), reply.encode(), payload, len(payload)))
        else:
            _check(_lib.rb_publish(self._h(), subject.encode(), payload, len(payload)))

    def publish_acked(self, subject: str, data: Union[bytes, str] = b"", timeout: float = 5.0,
                      headers: Optional[Headers] = None) -> PubAck:
        """Publishes and waits until a stream stored the message durably: its
        stream and sequence. A "Msg-Id" header makes a retry safe (duplicate:
        stored before, nothing stored again). NoStream, StreamFull, DiskFull,
        PayloadTooLarge, PermissionDenied, Timeout (retry with the same
        Msg-Id), InvalidArgument for a broker without streams."""
        payload = _bytes(data)
        array, count = _c_headers(headers) if headers else (None, 0)
        out = _CPubAck()
        _check(_lib.rb_publish_acked(self._h(), subject.encode(), array, count, payload, len(payload),
                                     _ms(timeout), ctypes.byref(out)))
        return PubAck(out.stream.decode(), out.sequence, bool(out.duplicate))

    def request(self, subject: str, data: Union[bytes, str] = b"", timeout: float = 5.0,
                headers: Optional[Headers] = None) -> Message:
        """Sends a request and returns the first reply. NoResponders when
        nobody subscribes to the subject; Timeout when nobody answered."""
        payload = _bytes(data)
        out = ctypes.POINTER(_CMessage)()
        if headers:
            array, count = _c_headers(headers)
            _check(_lib.rb_request_headers(self._h(), subject.encode(), array, count, payload, len(payload),
                                           _ms(timeout), ctypes.byref(out)))
        else:
            _check(_lib.rb_request(self._h(), subject.encode(), payload, len(payload), _ms(timeout),
                                   ctypes.byref(out)))
        try:
            return _message(out.contents)
        finally:
            _lib.rb_message_free(out)

    def subscribe(self, subject: str, callback: Optional[Callable[[Message], None]] = None,
                  queue: str = "") -> Subscription:
        """Subscribes to `subject` (wildcards: * one token, > the rest), in
        queue group `queue` if given (each message to one member). With a
        callback, it is called on the library's thread for each message (an
        exception it raises is printed and the deliveries go on); without,
        read the returned Subscription."""
        h = self._h()
        if callback is None:
            sub = ctypes.c_void_p()
            _check(_lib.rb_queue_subscribe_sync(h, subject.encode(), queue.encode(), ctypes.byref(sub)))
            return Subscription(self, _lib.rb_subscription_sid(sub), handle=sub)

        def deliver(msg, _user):
            _guarded(callback, _message(msg.contents))

        c_callback = _MESSAGE_CB(deliver)
        sid = ctypes.c_uint32()
        _check(_lib.rb_queue_subscribe(h, subject.encode(), queue.encode(), c_callback, None, ctypes.byref(sid)))
        self._callbacks[sid.value] = c_callback
        return Subscription(self, sid.value, callback=c_callback)

    def consume(self, stream: str, **options) -> "Consumer":
        """Opens a consumer of `stream` (docs/streams.md): durable="name"
        (else ephemeral), start="all"|"new"|"last"|"last_per_subject"|
        "sequence"|"time" (start_sequence, start_time in seconds since the
        epoch), ack="explicit"|"cumulative"|"none", ack_wait (s),
        max_deliver, max_ack_pending, pull, original_pace, timeout (s).
        NoStream, ConsumerInvalid, PermissionDenied."""
        return Consumer(self, stream, **options)

    def server_info(self) -> ServerInfo:
        """The last INFO the broker sent: the brokers of its cluster, which a
        reconnecting client also tries (docs/cluster.md)."""
        out = ctypes.POINTER(_CServerInfo)()
        _check(_lib.rb_server_info_get(self._h(), ctypes.byref(out)))
        try:
            return _server_info(out.contents)
        finally:
            _lib.rb_server_info_free(out)

    def flush(self, timeout: float = 10.0) -> None:
        """Waits until the broker has processed everything sent before."""
        _check(_lib.rb_flush(self._h(), _ms(timeout)))

    def close(self) -> None:
        """Closes the connection (idempotent); subscriptions end."""
        with self._lock:
            handle, self._handle = self._handle, None
        if handle is not None:
            _lib.rb_close(handle)
        self._callbacks.clear()

    @property
    def closed(self) -> bool:
        return self._handle is None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def connect(url: str, bind: Optional[str] = None, **options) -> Client:
    """Connects to rdmabrokerd at `url`: "rdma://host[:port]",
    "tcp://host[:port]" or "tls://host[:port]", credentials as
    "user:password@" or "token@" before the host, or as options. `bind` is a local address (over RDMA it selects
    the device). Options (keywords; None or absent: the library's default):

    user, password, token   credentials
    tls_ca                  tls://: CA certificates (PEM file) the broker's
                            certificate must chain to (the system's)
    tls_cert, tls_key       mutual TLS: this client's certificate and key
    tls_server_name         the name the broker's certificate must carry
                            (the URL's host)
    reconnect               reconnect with backoff when the connection fails,
                            restoring every subscription (False)
    max_reconnect_attempts  per outage, then the client closes (0: for ever)
    connect_timeout, publish_timeout, reconnect_delay, reconnect_max_delay
                            seconds (5, 5, 0.1, 5); a publish waits up to
                            publish_timeout for room or for a reconnect
    on_error(err)           an asynchronous error, e.g. a publish the broker
                            refused (PermissionDenied): an Error instance
    on_connection_event(kind, reason)
                            "disconnected", "reconnected" or "gave_up", and
                            why the connection was lost
    ignore_announced_servers
                            with reconnect: try only `url`, never the brokers
                            a broker of a cluster announces (False)
    on_server_info(info)    each INFO of a broker of a cluster (ServerInfo);
                            Client.server_info() gives the last one
    rendezvous              RDMA: large messages offered for the broker to
                            READ and written into a landing area (SPEC.md
                            §3.8, §3.9); False: fragments both ways (True)
    Callbacks run on the library's thread."""
    return Client(url, bind, **options)


from .consumer import Consumer  # noqa: E402  (it uses the C API loaded above)
