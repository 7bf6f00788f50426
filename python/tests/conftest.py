# SPDX-License-Identifier: Apache-2.0
"""The brokers of the tests, over the transport the run is for: one shared by
the tests that only publish and subscribe (`broker`: each uses subjects of its
own; starting a broker costs seconds in the emulated guest), one of its own
for a test that stops or restarts it (`own_broker`) or configures it
(`make_broker`).

RDMABROKER_TEST_VIA=tcp (the host) or rdma (the Soft-RoCE guest: the broker on
RDMABROKER_GUEST_ADDR1, clients bound to ADDR2, so traffic crosses rxe).
RDMABROKERD and RDMABROKER_CLI name the programs of the tree under test
(CMake sets them, with RDMABROKER_LIBRARY and PYTHONPATH).
"""

import fcntl
import os
import socket
import subprocess
import tempfile
import time

import pytest


class _PortBlocks:
    """Ports below the kernel's ephemeral range, so that no client socket can
    hold one between the choice and the broker's bind (a port the kernel
    handed out as free is some connect()'s next local port). Blocks of 20,
    claimed with a lock on a file held for the life of the process, as the
    C++ tests' harness does (tests/rdma/harness.cpp): runs at once never share one."""

    def __init__(self) -> None:
        self._held = []  # the lock files, kept open
        self._next = self._end = 0

    def take(self) -> int:
        if self._next == self._end:
            self._next = self._claim()
            self._end = self._next + 20
        self._next += 1
        return self._next - 1

    def _claim(self) -> int:
        directory = "/tmp/rdmabroker-test-ports"
        os.makedirs(directory, exist_ok=True)
        for i in range(1000):
            block = (os.getpid() + i) % 1000
            f = open(os.path.join(directory, str(block)), "a")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                f.close()
                continue
            self._held.append(f)
            return 10000 + block * 20
        raise RuntimeError(f"no free port block in {directory}")


_ports = _PortBlocks()


def _free_port() -> int:
    return _ports.take()


class Broker:
    """`config`: YAML, where @URL@ stands for the broker's own url()."""

    def __init__(self, via: str, config: str = "", anonymous: bool = True):
        self.via = via
        self.port, self.tcp_port = _free_port(), _free_port()
        config = config.replace("@URL@", self.url())
        self.dir = tempfile.TemporaryDirectory(prefix="rdmabroker-py-")
        self.admin = os.path.join(self.dir.name, "admin.sock")
        args = [os.environ["RDMABROKERD"], "--port", str(self.port), "--tcp-port", str(self.tcp_port),
                "--admin-socket", self.admin, "--metrics-listen", "", "--pool-buffers", "2048",
                "--srq-depth", "256", "--log-level", "warn"]
        if config:
            path = os.path.join(self.dir.name, "broker.yaml")
            with open(path, "w") as f:
                f.write(config)
            args += ["--config", path]
        else:
            args += ["--no-config"]
        if anonymous:
            args.append("--allow-anonymous")
        args += ["--rdma", "on" if via == "rdma" else "off"]
        self.args = args
        self._start()

    def _start(self) -> None:
        self.process = subprocess.Popen(self.args)
        # Ready when its admin socket answers (opened once the listeners are bound).
        deadline = time.monotonic() + 30
        while not self._admin_answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"rdmabrokerd did not start ({self.process.returncode})")
            time.sleep(0.05)

    def _admin_answers(self) -> bool:
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(self.admin)
                s.sendall(b"stats\n")
                return s.recv(1) != b""
        except OSError:
            return False

    def url(self, credentials: str = "") -> str:
        who = credentials + "@" if credentials else ""
        if self.via == "rdma":
            return f"rdma://{who}{os.environ['RDMABROKER_GUEST_ADDR1']}:{self.port}"
        return f"tcp://{who}127.0.0.1:{self.tcp_port}"

    @property
    def bind(self):
        return os.environ["RDMABROKER_GUEST_ADDR2"] if self.via == "rdma" else None

    def restart(self) -> int:
        """Stops it (SIGTERM) and starts it again on the same ports."""
        self.process.terminate()
        code = self.process.wait(timeout=30)
        self._start()
        return code

    def stop(self) -> int:
        self.process.terminate()
        code = self.process.wait(timeout=30)
        self.dir.cleanup()
        return code


def _via() -> str:
    v = os.environ.get("RDMABROKER_TEST_VIA", "tcp")
    if v == "rdma" and not os.environ.get("RDMABROKER_GUEST_ADDR1"):
        pytest.fail("RDMA tests run in the Soft-RoCE guest (tests/softroce/run-in-guest.sh)")
    return v


@pytest.fixture
def via() -> str:
    return _via()


@pytest.fixture(scope="session")
def _shared_broker():
    b = Broker(_via())
    yield b
    assert b.stop() == 0, "rdmabrokerd did not exit cleanly"


@pytest.fixture
def broker(_shared_broker):
    assert _shared_broker.process.poll() is None, "the shared broker died during an earlier test"
    return _shared_broker


@pytest.fixture
def own_broker(via):
    b = Broker(via)
    yield b
    assert b.stop() == 0, "rdmabrokerd did not exit cleanly"


@pytest.fixture
def make_broker(via):
    made = []

    def make(config: str = "", anonymous: bool = True) -> Broker:
        made.append(Broker(via, config, anonymous))
        return made[-1]

    yield make
    for b in made:
        assert b.stop() == 0


@pytest.fixture
def hash_secret():
    def run(secret: str) -> str:
        out = subprocess.run([os.environ["RDMABROKER_CLI"], "passwd", "--scheme", "sha512crypt", "--cost", "1000"],
                             input=secret + "\n", capture_output=True, text=True, check=True)
        return out.stdout.strip()
    return run
