# SPDX-License-Identifier: Apache-2.0
"""The exceptions of the rdmabroker package, one per kind of failure of the
C API (client-lib/include/rdmabroker/rdmabroker.h), re-exported by it."""


class Error(Exception):
    """A failure of the library; `kind` names it as the C++ API does."""

    kind = "error"

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.message = message
        self.status = status


class InvalidArgument(Error, ValueError):
    kind = "invalid_argument"


class ConnectFailed(Error, ConnectionError):
    kind = "connect_failed"


class Rejected(Error, ConnectionError):
    kind = "rejected"


class Timeout(Error, TimeoutError):
    kind = "timeout"


class Closed(Error):
    kind = "closed"


class BrokerError(Error):
    kind = "broker_error"


class ResourceError(Error):
    kind = "resource"


class PayloadTooLarge(Error, ValueError):
    kind = "payload_too_large"


class NoResponders(Error):
    kind = "no_responders"


class AuthenticationFailed(Error, PermissionError):
    kind = "authentication_failed"


class PermissionDenied(Error, PermissionError):
    kind = "permission_denied"


class MessagesLost(Error):
    kind = "messages_lost"


class NoStream(Error):
    kind = "no_stream"


class StreamFull(Error):
    kind = "stream_full"


class DiskFull(Error, OSError):
    kind = "disk_full"


class ConsumerInvalid(Error, ValueError):
    kind = "consumer_invalid"


# rb_status (client-lib/include/rdmabroker/rdmabroker.h) -> exception class.
_ERRORS = {
    -1: InvalidArgument, -2: ConnectFailed, -3: Rejected, -4: Timeout, -5: Closed, -6: BrokerError,
    -7: ResourceError, -8: PayloadTooLarge, -9: NoResponders, -10: AuthenticationFailed,
    -11: PermissionDenied, -12: MessagesLost, -13: NoStream, -14: StreamFull, -15: DiskFull,
    -16: ConsumerInvalid,
}
