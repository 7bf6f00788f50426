# SPDX-License-Identifier: Apache-2.0
"""tls:// from Python: the options reach the library's TLS (docs/security.md).
TLS is served on the broker's TCP listener, so these run over loopback TCP in
both runs (host and guest)."""

import subprocess

import pytest

import rdmabroker

MAKE_CERTS = r"""set -e
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key" 2>/dev/null; }
key ca
openssl req -x509 -new -key ca.key -out ca.crt -days 2 -subj "/CN=py CA" 2>/dev/null
cert() {  # NAME CN SAN
  key "$1"
  openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$2" 2>/dev/null
  printf 'subjectAltName=%s\n' "$3" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" -days 2 \
    -extfile "$1.ext" 2>/dev/null
}
cert server broker IP:127.0.0.1
cert svc svc DNS:svc
"""


def test_tls_with_a_client_certificate_as_the_user(make_broker, tmp_path):
    subprocess.run(["/bin/sh", "-c", MAKE_CERTS], cwd=tmp_path, check=True)
    f = lambda name: str(tmp_path / name)  # noqa: E731
    config = ("auth:\n  anonymous: false\n  users:\n"
              "    - {name: svc, certificate: true, subscribe: {allow: [\"py.>\"]}}\n"
              f"tls:\n  mode: required\n  certificate: {f('server.crt')}\n  key: {f('server.key')}\n"
              f"  client_ca: {f('ca.crt')}\n")
    b = make_broker(config, anonymous=False)
    url = f"tls://127.0.0.1:{b.tcp_port}"
    with rdmabroker.connect(url, tls_ca=f("ca.crt"), tls_cert=f("svc.crt"), tls_key=f("svc.key")) as c:
        sub = c.subscribe("py.tls")
        c.flush()
        c.publish("py.tls", b"through TLS")
        assert sub.next(timeout=10).data == b"through TLS"
        denied = c.subscribe("other.x")  # svc's permissions, from its certificate's CN
        with pytest.raises((rdmabroker.PermissionDenied, rdmabroker.Closed), match="denied for user 'svc'"):
            denied.next(timeout=10)
    with pytest.raises(rdmabroker.ConnectFailed, match="certificate required"):
        rdmabroker.connect(url, tls_ca=f("ca.crt"))  # no client certificate
    with pytest.raises(rdmabroker.ConnectFailed, match="certificate verify failed"):
        rdmabroker.connect(url, tls_cert=f("svc.crt"), tls_key=f("svc.key"))  # the system's CAs do not know it
    with pytest.raises(rdmabroker.Rejected, match="TLS required"):
        rdmabroker.connect(f"tcp://127.0.0.1:{b.tcp_port}")
