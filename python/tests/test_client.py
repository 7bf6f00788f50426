# SPDX-License-Identifier: Apache-2.0
"""The Python package against a real broker, over TCP on the host and RDMA
in the guest (conftest.py): what a Python user relies on."""

import os
import socket
import threading
import time

import pytest

import rdmabroker


def connect(broker, credentials=""):
    return rdmabroker.connect(broker.url(credentials), bind=broker.bind)


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_callback_receives_every_message_in_order_byte_exact(broker):
    got = []
    with connect(broker) as sub, connect(broker) as pub:
        sub.subscribe("py.seq", callback=got.append)
        sub.flush()
        sent = [bytes([i % 256]) * (i * 37 % 4000) + str(i).encode() for i in range(300)]
        for payload in sent:
            pub.publish("py.seq", payload)
        pub.flush()
        assert wait_for(lambda: len(got) == len(sent)), f"{len(got)} of {len(sent)}"
    assert [m.data for m in got] == sent
    assert {m.subject for m in got} == {"py.seq"}


def test_large_messages_arrive_whole_with_rendezvous_on_or_off(broker):
    # Over RDMA: offered and landing (SPEC.md §3.8, §3.9) or fragments both
    # ways, in every pairing; over TCP the option changes nothing.
    big = bytes(range(256)) * 2048  # 512 KiB: above rendezvous_min, below max_payload
    for pub_rdv in (True, False):
        for sub_rdv in (True, False):
            with rdmabroker.connect(broker.url(), bind=broker.bind, rendezvous=sub_rdv) as sub, \
                    rdmabroker.connect(broker.url(), bind=broker.bind, rendezvous=pub_rdv) as pub:
                s = sub.subscribe("py.big")
                sub.flush()
                pub.publish("py.big", big)
                pub.flush()
                m = s.next(timeout=30)
                assert m.data == big, f"publisher rendezvous={pub_rdv}, subscriber rendezvous={sub_rdv}"


def test_iterator_and_next_with_timeout(broker):
    with connect(broker) as client:
        sub = client.subscribe("py.iter.>")
        client.flush()
        with pytest.raises(rdmabroker.Timeout):
            sub.next(timeout=0.2)
        with pytest.raises(TimeoutError):  # also the built-in kind
            sub.next(timeout=0)
        for i in range(5):
            client.publish(f"py.iter.{i}", f"m{i}")
        got = list(sub.messages(timeout=2))  # stops once 2 s pass without a message
        assert [(m.subject, m.data) for m in got] == [(f"py.iter.{i}", f"m{i}".encode()) for i in range(5)]
        assert all(m.sid == sub.sid for m in got)


def test_queue_group_gives_each_message_to_exactly_one_member(broker):
    counts = [[], []]
    with connect(broker) as a, connect(broker) as b, connect(broker) as pub:
        a.subscribe("py.jobs", callback=counts[0].append, queue="workers")
        b.subscribe("py.jobs", callback=counts[1].append, queue="workers")
        a.flush()
        b.flush()
        for i in range(200):
            pub.publish("py.jobs", str(i))
        pub.flush()
        assert wait_for(lambda: len(counts[0]) + len(counts[1]) == 200)
        time.sleep(0.2)  # nothing more arrives
    seen = sorted(int(m.data) for m in counts[0] + counts[1])
    assert seen == list(range(200))
    assert counts[0] and counts[1], "both members got some"


def test_request_reply_no_responders_and_timeout(broker):
    with connect(broker) as responder, connect(broker) as client:
        def answer(m):
            responder.publish(m.reply, b"pong:" + m.data)
        responder.subscribe("py.svc", callback=answer)
        responder.subscribe("py.silent")  # subscribed, never answers
        responder.flush()
        reply = client.request("py.svc", b"ping", timeout=10)
        assert reply.data == b"pong:ping"
        with pytest.raises(rdmabroker.NoResponders):
            client.request("py.nobody", b"x", timeout=10)
        start = time.monotonic()
        with pytest.raises(rdmabroker.Timeout):
            client.request("py.silent", b"x", timeout=0.5)
        assert time.monotonic() - start >= 0.4


def test_publish_with_a_reply_subject(broker):
    with connect(broker) as client:
        sub = client.subscribe("py.r")
        client.flush()
        client.publish("py.r", "hi", reply="py.inbox.1")
        m = sub.next(timeout=10)
        assert (m.data, m.reply) == (b"hi", "py.inbox.1")


def test_headers_travel_with_messages_requests_and_replies(broker):
    with connect(broker) as responder, connect(broker) as client:
        def answer(m):
            responder.publish(m.reply, b"pong", headers={"Trace-Id": m.header("trace-id"), "Answered-By": "py"})
        responder.subscribe("py.h.svc", callback=answer)
        sub = responder.subscribe("py.h.feed")
        responder.flush()
        client.publish("py.h.feed", b"one", headers=[("Accept", "a"), ("Accept", "b"), ("Note", "grüße")])
        client.publish("py.h.feed", b"two")
        client.publish("py.h.feed", b"three", reply="py.h.inbox", headers={"X-Empty": ""})
        first, second, third = sub.next(timeout=10), sub.next(timeout=10), sub.next(timeout=10)
        assert first.headers == (("Accept", "a"), ("Accept", "b"), ("Note", "grüße"))
        assert first.header("ACCEPT") == "a" and first.header("missing") is None
        assert (second.data, second.headers) == (b"two", ())
        assert (third.reply, third.headers) == ("py.h.inbox", (("X-Empty", ""),))
        reply = client.request("py.h.svc", b"ping", timeout=10, headers={"Trace-Id": "t-42"})
        assert reply.headers == (("Trace-Id", "t-42"), ("Answered-By", "py"))
        with pytest.raises(rdmabroker.InvalidArgument, match="invalid header name"):
            client.publish("py.h.feed", b"x", headers={"no spaces": "x"})
        with pytest.raises(rdmabroker.InvalidArgument, match="no CR, LF or NUL"):
            client.publish("py.h.feed", b"x", headers={"X": "a\r\nInjected: 1"})


def test_unsubscribe_stops_the_deliveries(broker):
    got = []
    with connect(broker) as client:
        sub = client.subscribe("py.u", callback=got.append)
        client.flush()
        client.publish("py.u", b"1")
        assert wait_for(lambda: len(got) == 1)
        sub.unsubscribe()
        client.publish("py.u", b"2")
        client.flush()
        time.sleep(0.2)
        assert [m.data for m in got] == [b"1"]


def test_a_callback_that_raises_does_not_stop_the_deliveries(broker, capfd):
    got = []

    def flaky(m):
        if m.data == b"bad":
            raise RuntimeError("the application's bug")
        got.append(m)

    with connect(broker) as client:
        client.subscribe("py.f", callback=flaky)
        client.flush()
        for data in (b"1", b"bad", b"2"):
            client.publish("py.f", data)
        client.flush()
        assert wait_for(lambda: len(got) == 2)
    assert "the application's bug" in capfd.readouterr().err


def test_context_manager_closes_and_then_calls_raise_closed(broker):
    with connect(broker) as client:
        sub = client.subscribe("py.c")
    assert client.closed
    with pytest.raises(rdmabroker.Closed):
        client.publish("py.c", b"x")
    with pytest.raises(rdmabroker.Closed):
        sub.next(timeout=1)
    client.close()  # idempotent


def _host_has_rdma_device():
    try:
        return bool(os.listdir("/sys/class/infiniband"))
    except FileNotFoundError:
        return False


def test_errors_are_exceptions_of_the_librarys_kinds(broker):
    with pytest.raises(rdmabroker.InvalidArgument):
        rdmabroker.connect("http://127.0.0.1:1")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        nobody = s.getsockname()[1]
    with pytest.raises(rdmabroker.ConnectFailed) as refused:
        rdmabroker.connect(f"tcp://127.0.0.1:{nobody}")
    assert isinstance(refused.value, ConnectionError)
    if not _host_has_rdma_device():
        # A host without RDMA devices: an rdma:// URL says so and what to use instead.
        with pytest.raises(rdmabroker.ConnectFailed) as no_device:
            rdmabroker.connect(f"rdma://127.0.0.1:{nobody}")
        assert "no RDMA device on this host" in str(no_device.value)
        assert "tcp://HOST:7471" in str(no_device.value)
    with connect(broker) as client:
        with pytest.raises(rdmabroker.InvalidArgument):
            client.publish("bad subject with spaces", b"x")
        with pytest.raises(rdmabroker.InvalidArgument):
            client.subscribe("a.>.b")
        with pytest.raises(rdmabroker.PayloadTooLarge):
            client.publish("py.big", b"x" * ((1 << 20) + 1))  # the broker's limits.max_payload, plus one


def one_user(name, password_hash, publish="py.ok.>", subscribe=">"):
    """A broker config with one user, anonymous clients refused."""
    return (f"auth:\n  anonymous: false\n  users:\n    - name: {name}\n      password: '{password_hash}'\n"
            f"      publish: {{allow: ['{publish}']}}\n      subscribe: {{allow: ['{subscribe}']}}\n")


def test_credentials_and_permissions(make_broker, hash_secret):
    broker = make_broker(one_user("alice", hash_secret("alice-pw"), subscribe="py.ok.>"), anonymous=False)
    with pytest.raises(rdmabroker.AuthenticationFailed) as wrong:
        connect(broker, "alice:wrong")
    assert "wrong password" in str(wrong.value)
    with connect(broker, "alice:alice-pw") as alice:
        sub = alice.subscribe("py.ok.x")
        alice.publish("py.ok.x", b"allowed")
        assert sub.next(timeout=10).data == b"allowed"
        denied = alice.subscribe("py.secret")
        with pytest.raises((rdmabroker.PermissionDenied, rdmabroker.Closed)) as refused:
            denied.next(timeout=10)
        assert "denied" in str(refused.value)


def test_many_threads_share_one_client(broker):
    got = []
    lock = threading.Lock()

    def keep(m):
        with lock:
            got.append(m.data)

    with connect(broker) as sub, connect(broker) as pub:
        sub.subscribe("py.t.*", callback=keep)
        sub.flush()

        def publish(t):
            for i in range(100):
                pub.publish(f"py.t.{t}", f"{t}:{i}")

        threads = [threading.Thread(target=publish, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        pub.flush()
        assert wait_for(lambda: len(got) == 400)
    for t in range(4):  # each publisher's order kept
        mine = [int(d.split(b":")[1]) for d in got if d.startswith(f"{t}:".encode())]
        assert mine == list(range(100))


def test_reconnect_restores_subscriptions_and_reports_the_outage(own_broker):
    broker = own_broker
    events = []
    got = []
    with rdmabroker.connect(broker.url(), bind=broker.bind, reconnect=True, reconnect_delay=0.05,
                            reconnect_max_delay=0.5, publish_timeout=30,
                            on_connection_event=lambda kind, why: events.append((kind, why))) as client:
        client.subscribe("py.back", callback=got.append)
        client.flush()
        client.publish("py.back", b"before")
        assert wait_for(lambda: len(got) == 1)
        assert broker.restart() == 0
        assert wait_for(lambda: ("reconnected" in [k for k, _ in events]), 60), events
        client.publish("py.back", b"after")  # the same subscription, restored
        client.flush(timeout=30)
        assert wait_for(lambda: len(got) == 2, 30)
    assert [m.data for m in got] == [b"before", b"after"]
    assert events[0][0] == "disconnected" and "shutting down" in events[0][1], events


def test_gave_up_closes_the_client(own_broker):
    broker = own_broker
    events = []
    client = rdmabroker.connect(broker.url(), bind=broker.bind, reconnect=True, reconnect_delay=0.05,
                                max_reconnect_attempts=2, on_connection_event=lambda k, w: events.append(k))
    broker.process.terminate()
    broker.process.wait(timeout=30)
    assert wait_for(lambda: "gave_up" in events, 60), events
    with pytest.raises(rdmabroker.Closed) as closed:
        client.publish("py.gone", b"x")
    assert "gave up reconnecting after 2 attempts" in str(closed.value)
    client.close()
    broker._start()  # for the fixture's clean stop


def test_options_carry_credentials_and_errors_reach_on_error(make_broker, hash_secret):
    broker = make_broker(one_user("bob", hash_secret("bob-pw")), anonymous=False)
    errors = []
    with rdmabroker.connect(broker.url(), bind=broker.bind, user="bob", password="bob-pw",
                            on_error=errors.append) as bob:
        bob.publish("py.ok.x", b"fine")
        bob.publish("py.not.allowed", b"refused")  # accepted locally; the broker refuses it
        bob.flush()
        assert wait_for(lambda: errors), "no asynchronous error reported"
    assert isinstance(errors[0], rdmabroker.PermissionDenied), errors
    assert "py.not.allowed" in errors[0].message
    with pytest.raises(rdmabroker.AuthenticationFailed):
        rdmabroker.connect(broker.url(), bind=broker.bind, user="bob", password="wrong")


CLUSTER = ("cluster:\n  name: py\n  user: route\n  password: s3cret-route\n"
           "  advertise: [@URL@]\n  client_advertise: [@URL@]\n")


def test_a_client_learns_the_cluster_and_fails_over_unless_told_not_to(make_broker):
    # B is A's seed route; B dials back the URL A advertises (docs/cluster.md).
    b = make_broker(CLUSTER + "  routes: []\n")
    a = make_broker(CLUSTER + f"  routes: [{b.url()}]\n")
    infos, fixed_events, got = [], [], []
    options = dict(bind=a.bind, reconnect=True, reconnect_delay=0.05, reconnect_max_delay=0.2,
                   publish_timeout=30)
    with rdmabroker.connect(a.url(), on_server_info=infos.append, **options) as mover, \
            rdmabroker.connect(a.url(), ignore_announced_servers=True, max_reconnect_attempts=3,
                               on_connection_event=lambda kind, _why: fixed_events.append(kind),
                               **options) as fixed:
        assert wait_for(lambda: len(mover.server_info().peers) == 1, 30), mover.server_info()
        info = mover.server_info()
        assert info.cluster == "py"
        assert len(info.broker.id) == 16
        assert info.broker.urls == [a.url()] and info.broker.routes == [a.url()]
        assert [(p.urls, p.routes) for p in info.peers] == [([b.url()], [b.url()])]
        assert info.peers[0].id != info.broker.id
        assert info.client_urls == [a.url(), b.url()]
        assert wait_for(lambda: infos and infos[-1] == info), infos  # the callback saw the same
        mover.subscribe("py.cluster", callback=got.append)
        mover.flush()
        assert a.stop() == 0
        # The one given only A's URL moves to B, which A announced; the one
        # told to ignore announcements tries A alone, and gives up.
        assert wait_for(lambda: mover.server_info().broker.urls == [b.url()], 60), mover.server_info()
        assert wait_for(lambda: "gave_up" in fixed_events, 60), fixed_events
        with pytest.raises(rdmabroker.Closed):
            fixed.publish("py.cluster", b"never")
        mover.publish("py.cluster", b"on B")  # its subscription came along
        mover.flush(timeout=30)
        assert wait_for(lambda: len(got) == 1, 30)
    assert got[0].data == b"on B"


def test_publish_acked_names_the_stream_and_sequence_and_refusals_are_typed(make_broker, tmp_path):
    b = make_broker(f"storage: {{directory: {tmp_path}}}\n"
                    "streams:\n"
                    "  - {name: ORDERS, subjects: [\"orders.>\"]}\n"
                    "  - {name: FULL, subjects: [full], max_msgs: 1, discard: new}\n")
    with rdmabroker.connect(b.url(), bind=b.bind) as c:
        first = c.publish_acked("orders.eu", b"one", headers={"Msg-Id": "o-1"})
        assert first == rdmabroker.PubAck("ORDERS", 1, False)
        assert c.publish_acked("orders.us", "two").sequence == 2
        # Sent again with the same Msg-Id (a retry after a lost answer): stored once.
        assert c.publish_acked("orders.eu", b"one", headers={"Msg-Id": "o-1"}) == rdmabroker.PubAck("ORDERS", 1, True)
        with pytest.raises(rdmabroker.NoStream):
            c.publish_acked("elsewhere", b"x")
        assert c.publish_acked("full", b"x").sequence == 1
        with pytest.raises(rdmabroker.StreamFull):
            c.publish_acked("full", b"y")

