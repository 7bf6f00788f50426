// SPDX-License-Identifier: Apache-2.0
/* librdmabroker C API: a plain C face of the C++ client for other languages.
 * Every call returns RB_OK (0) or a negative rb_status; rb_last_error() gives
 * the message of the calling thread's last failure. */
#ifndef RDMABROKER_RDMABROKER_H
#define RDMABROKER_RDMABROKER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library exports this API and nothing else (it is built with hidden
 * visibility; deploy/debian/lib/symbols lists what it exports). */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

typedef enum {
  RB_OK = 0,
  RB_ERR_INVALID_ARGUMENT = -1,
  RB_ERR_CONNECT_FAILED = -2,
  RB_ERR_REJECTED = -3,
  RB_ERR_TIMEOUT = -4,
  RB_ERR_CLOSED = -5,
  RB_ERR_BROKER = -6,
  RB_ERR_RESOURCE = -7,
  RB_ERR_PAYLOAD_TOO_LARGE = -8,
  RB_ERR_NO_RESPONDERS = -9,      /* rb_request: nobody subscribes to the subject */
  RB_ERR_AUTHENTICATION = -10,    /* rb_connect: the broker refused the credentials */
  RB_ERR_PERMISSION_DENIED = -11, /* the user may not publish or subscribe to that subject */
  RB_ERR_MESSAGES_LOST = -12,     /* multicast: messages beyond the broker's retransmit window */
  RB_ERR_NO_STREAM = -13,         /* rb_publish_acked: no stream takes the subject */
  RB_ERR_STREAM_FULL = -14,       /* rb_publish_acked: the stream refuses new messages (discard: new) */
  RB_ERR_DISK_FULL = -15,         /* rb_publish_acked: the broker's file system is full */
  RB_ERR_CONSUMER_INVALID = -16 /* rb_consume: settings out of range, or a durable name in use with others */
} rb_status;

typedef struct rb_client rb_client;
typedef struct rb_subscription rb_subscription;

/* A message header field (docs/headers.md): the name is printable ASCII
 * without space or ':', the value any text without CR or LF. */
typedef struct rb_header {
  const char* name;
  const char* value;
} rb_header;

/* A message: valid for the duration of a callback, or until rb_message_free
 * for one returned by rb_next_message. */
typedef struct rb_message {
  uint32_t sid;
  const char* subject;
  const char* reply; /* "" when the publisher wants no answer */
  const void* data;
  size_t len;
  void* owner_;             /* internal: set by rb_next_message for rb_message_free */
  const rb_header* headers; /* the publisher's header fields, in order (NULL when header_count is 0) */
  size_t header_count;
  uint64_t stream_sequence; /* from a consumer (rb_consume): its sequence in the stream; else 0 */
  uint32_t deliveries;      /* ... and how many times it was delivered, this one included */
} rb_message;

/* The first value of header `name` (compared without regard to ASCII case),
 * or NULL if the message has none. */
const char* rb_message_header(const rb_message* m, const char* name);

typedef void (*rb_message_cb)(const rb_message* msg, void* user);

/* A message seen in place (rb_subscribe_view): pointers into the library's
 * receive buffer, valid only during the callback; nothing is copied or
 * allocated to deliver it. The strings are NOT NUL-terminated: use the
 * lengths. */
typedef struct rb_message_view {
  uint32_t sid;
  const char* subject;
  size_t subject_len;
  const char* reply; /* reply_len 0: the publisher wants no answer */
  size_t reply_len;
  const void* data;
  size_t len;
  const void* internal_; /* for rb_view_header */
} rb_message_view;

/* The first value of header `name` (compared without regard to ASCII case),
 * read in place, its length in *value_len; NULL if the message has none. */
const char* rb_view_header(const rb_message_view* m, const char* name, size_t* value_len);

/* When the library took the message from the transport, in nanoseconds of
 * CLOCK_MONOTONIC (MessageView::received_at); 0 if not known. */
int64_t rb_view_received_ns(const rb_message_view* m);
/* How long the message spent in the broker, in nanoseconds (protocol
 * version 5, SPEC.md §3.4; MessageView::relay_time); 0 if the broker did not say. */
uint64_t rb_view_relay_ns(const rb_message_view* m);

typedef void (*rb_view_cb)(const rb_message_view* msg, void* user);

/* bind_address may be NULL. Credentials go in the URL: "rdma://user:password@host"
 * or "rdma://token@host" (RB_ERR_AUTHENTICATION when the broker refuses them). */
int rb_connect(const char* url, const char* bind_address, rb_client** out);

/* What a reconnecting client reports (rb_options.on_connection_event). */
typedef enum { RB_DISCONNECTED = 0, RB_RECONNECTED = 1, RB_GAVE_UP = 2 } rb_connection_event;
/* An asynchronous error (a publish or subscription the broker refused, ...),
 * called on the library's thread: status is an rb_status. */
typedef void (*rb_error_cb)(int status, const char* message, void* user);
/* The connection was lost, restored (subscriptions restored), or given up
 * on; `reason` says why it was lost. Called on the library's thread. */
typedef void (*rb_connection_cb)(rb_connection_event event, const char* reason, void* user);

/* A broker as an INFO names it (ServerInfo::Broker in client.hpp). */
typedef struct rb_broker_info {
  const char* id;          /* random at each start of that broker */
  const char* const* urls; /* where clients reach it */
  size_t url_count;
  const char* const* routes; /* where other brokers' routes reach it */
  size_t route_count;
} rb_broker_info;

/* What the broker of a cluster says about itself and the brokers it has
 * routes up to (SPEC.md §8, "Gossip"; docs/cluster.md). Valid for the
 * duration of a callback, or until rb_server_info_free for one returned by
 * rb_server_info_get. */
typedef struct rb_server_info {
  rb_broker_info self; /* self.id "": no INFO (yet, or not in a cluster) */
  const char* cluster;
  const rb_broker_info* peers;
  size_t peer_count;
  const char* const* client_urls; /* every client URL announced: the broker's, then its peers', once each */
  size_t client_url_count;
  void* owner_; /* internal */
} rb_server_info;
/* Each INFO the broker sends, on the library's thread. */
typedef void (*rb_server_info_cb)(const rb_server_info* info, void* user);

/* Options of rb_connect_with: rb_options_init() first, then set what you
 * need. `size` is sizeof(rb_options) as the caller was compiled: fields
 * added later go at the end, and a library never reads or writes past
 * `size`. Zero and NULL mean the library's defaults (docs/cli.md and
 * client.hpp name them). */
typedef struct rb_options {
  size_t size;
  const char* bind_address; /* local address; over RDMA it selects the device */
  const char* user;         /* credentials, instead of in the URL */
  const char* password;
  const char* token;
  int reconnect;              /* non-zero: reconnect with backoff, restoring subscriptions */
  int max_reconnect_attempts; /* 0: for ever */
  int connect_timeout_ms;     /* 0: 5000 */
  int publish_timeout_ms;     /* how long a publish waits for room or a reconnect; 0: 5000 */
  int reconnect_delay_ms;     /* first backoff; 0: 100 */
  int reconnect_max_delay_ms; /* 0: 5000 */
  rb_error_cb on_error;
  void* on_error_user;
  rb_connection_cb on_connection_event;
  void* on_connection_event_user;
  /* tls:// (docs/security.md); NULL: the system's CAs, no client certificate. */
  const char* tls_ca_file;     /* CA certificates (PEM) the broker's certificate must chain to */
  const char* tls_cert_file;   /* mutual TLS: this client's certificate (PEM) ... */
  const char* tls_key_file;    /* ... and its private key */
  const char* tls_server_name; /* the name the certificate must carry; NULL: the URL's host */
  /* Non-zero: no I/O thread; the application calls rb_poll (ClientOptions::polled
   * in client.hpp says how waits, callbacks and reconnecting then behave). */
  int polled;
  /* Non-zero: spin before sleeping as long as recent wake-ups say pays
   * (ClientOptions::adaptive_poll). */
  int adaptive_poll;
  /* With `reconnect`: non-zero tries only the URLs given to rb_connect_with,
   * never those a broker of a cluster announces (ClientOptions::ignore_announced_servers). */
  int ignore_announced_servers;
  rb_server_info_cb on_server_info;
  void* on_server_info_user;
  /* Non-zero: RDMA messages of the broker's limits.rendezvous_min or more go
   * as fragments both ways, neither offered nor landing (ClientOptions::rendezvous
   * false; SPEC.md §3.8, §3.9). */
  int no_rendezvous;
} rb_options;

/* Sets the `size` bytes of *options to the defaults and options->size to
 * `size`, sizeof(rb_options) as the caller was compiled; never writes past
 * them, whichever of caller and library is the newer. */
void rb_options_init_sized(rb_options* options, size_t size);
/* rb_options_init(&o) is rb_options_init_sized(&o, sizeof o): a program
 * passes its own struct's size. The function of that name, for programs
 * built before the macro, writes sizeof(rb_options) of this library. */
void rb_options_init(rb_options* options);
#define rb_options_init(options) rb_options_init_sized((options), sizeof *(options))
/* rb_connect with options (NULL: all defaults). */
int rb_connect_with(const char* url, const rb_options* options, rb_client** out);
/* url: "rdma://host[:port]", "tcp://host[:port]" or "tls://host[:port]". */
int rb_publish(rb_client* c, const char* subject, const void* data, size_t len);
/* Publishes with a reply subject for a responder to answer to. */
int rb_publish_request(rb_client* c, const char* subject, const char* reply, const void* data, size_t len);
/* Publishes with `count` header fields and, unless `reply` is NULL, a reply
 * subject. RB_ERR_INVALID_ARGUMENT for a bad name or value, or a broker of
 * protocol version 1, which has no headers. */
int rb_publish_headers(rb_client* c, const char* subject, const char* reply, const rb_header* headers,
                       size_t count, const void* data, size_t len);
/* What a stream said about an acknowledged publish (docs/streams.md). */
typedef struct rb_pub_ack {
  char stream[65];   /* the stream that stored it, NUL-terminated */
  uint64_t sequence; /* its sequence there */
  int duplicate;     /* 1: its Msg-Id header was stored before, as `sequence`: nothing stored again */
} rb_pub_ack;
/* Publishes with `count` header fields (a "Msg-Id" makes a retry safe) and
 * waits up to timeout_ms until a stream has stored the message durably;
 * fills *out (may be NULL). RB_ERR_NO_STREAM, RB_ERR_STREAM_FULL,
 * RB_ERR_DISK_FULL, RB_ERR_PAYLOAD_TOO_LARGE, RB_ERR_PERMISSION_DENIED,
 * RB_ERR_TIMEOUT (it may still be stored: retry with the same Msg-Id),
 * RB_ERR_INVALID_ARGUMENT for a broker older than protocol version 10. */
int rb_publish_acked(rb_client* c, const char* subject, const rb_header* headers, size_t count,
                     const void* data, size_t len, int timeout_ms, rb_pub_ack* out);
/* Stream consumers (docs/streams.md, "Consumers"; protocol version 11). */
typedef struct rb_consumer rb_consumer;
enum {
  RB_START_ALL,
  RB_START_NEW,
  RB_START_LAST,
  RB_START_LAST_PER_SUBJECT,
  RB_START_SEQUENCE,
  RB_START_TIME
};
enum { RB_ACK_NONE, RB_ACK_EXPLICIT, RB_ACK_CUMULATIVE };
typedef struct rb_consumer_options {
  const char* durable;      /* a durable consumer's name; NULL or "": ephemeral */
  int start;                /* RB_START_*: where a new consumer starts */
  uint64_t start_sequence;  /* RB_START_SEQUENCE */
  int64_t start_time_ns;    /* RB_START_TIME: CLOCK_REALTIME nanoseconds */
  int ack;                  /* RB_ACK_* */
  int ack_wait_ms;          /* redelivered when not acknowledged within this */
  uint32_t max_deliver;     /* 0: no limit */
  uint32_t max_ack_pending; /* flow control: outstanding messages at most */
  int pull;                 /* 1: messages only by rb_consumer_fetch */
  int original_pace;        /* 1: replay at the pace the messages were received */
} rb_consumer_options;
/* The defaults: ephemeral, from the start, explicit acks, 30 s, 1024 pending, push. */
void rb_consumer_options_init(rb_consumer_options* o);
/* Opens a consumer of `stream` (o may be NULL: the defaults); *pending (may
 * be NULL) gets the messages it has yet to deliver. RB_ERR_NO_STREAM,
 * RB_ERR_CONSUMER_INVALID, RB_ERR_PERMISSION_DENIED, RB_ERR_TIMEOUT,
 * RB_ERR_INVALID_ARGUMENT for a broker older than protocol version 11. */
int rb_consume(rb_client* c, const char* stream, const rb_consumer_options* o, int timeout_ms,
               rb_consumer** out, uint64_t* pending);
/* A push consumer's next message (free it with rb_message_free). */
int rb_consumer_next(rb_consumer* k, int timeout_ms, rb_message** out);
/* A pull consumer: up to `count` messages into out[0..*got), each freed with rb_message_free. */
int rb_consumer_fetch(rb_consumer* k, size_t count, int timeout_ms, rb_message** out, size_t* got);
/* Acknowledges m (RB_ACK_CUMULATIVE: and every earlier one); nak: deliver it again now. */
int rb_consumer_ack(rb_consumer* k, const rb_message* m);
int rb_consumer_nak(rb_consumer* k, const rb_message* m);
/* Leaves the consumer (a durable one stays on the broker) and frees the handle. */
void rb_consumer_close(rb_consumer* k);
/* Sends a request and waits up to timeout_ms for the first reply (free it with
 * rb_message_free). RB_ERR_NO_RESPONDERS: nobody subscribes; RB_ERR_TIMEOUT:
 * nobody answered in time. */
int rb_request(rb_client* c, const char* subject, const void* data, size_t len, int timeout_ms,
               rb_message** out);
/* rb_request with `count` header fields. */
int rb_request_headers(rb_client* c, const char* subject, const rb_header* headers, size_t count,
                       const void* data, size_t len, int timeout_ms, rb_message** out);
int rb_subscribe(rb_client* c, const char* subject, rb_message_cb cb, void* user, uint32_t* sid_out);
/* Joins queue group `group`: each message goes to one member of the group. */
int rb_queue_subscribe(rb_client* c, const char* subject, const char* group, rb_message_cb cb, void* user,
                       uint32_t* sid_out);
/* Subscribes with a callback that sees each message in place (rb_message_view). */
int rb_subscribe_view(rb_client* c, const char* subject, rb_view_cb cb, void* user, uint32_t* sid_out);
int rb_queue_subscribe_view(rb_client* c, const char* subject, const char* group, rb_view_cb cb, void* user,
                            uint32_t* sid_out);
int rb_subscribe_sync(rb_client* c, const char* subject, rb_subscription** out);
int rb_queue_subscribe_sync(rb_client* c, const char* subject, const char* group, rb_subscription** out);
/* Waits up to timeout_ms for a message; free it with rb_message_free. */
int rb_next_message(rb_subscription* s, int timeout_ms, rb_message** out);
void rb_message_free(rb_message* m);
/* The subscription id, for rb_unsubscribe. */
uint32_t rb_subscription_sid(const rb_subscription* s);
/* Frees the handle only; rb_unsubscribe stops the deliveries. */
void rb_subscription_free(rb_subscription* s);
int rb_unsubscribe(rb_client* c, uint32_t sid);
int rb_flush(rb_client* c, int timeout_ms);
/* A polled client (rb_options.polled): takes in what has arrived and runs its
 * callbacks on this thread, sends what is queued; waits up to timeout_us
 * (rounded up to the millisecond; 0: never) when nothing has arrived. The
 * messages delivered go to *delivered (may be NULL). RB_ERR_CLOSED once the
 * connection has ended; RB_ERR_INVALID_ARGUMENT for a client with an I/O
 * thread or from one of its callbacks. */
int rb_poll(rb_client* c, long timeout_us, size_t* delivered);
/* A polled client: the rb_poll waiting now on another thread returns, or if
 * none waits, the next one (Client::wake in client.hpp). Any thread, or a
 * callback. RB_ERR_INVALID_ARGUMENT for a client with an I/O thread,
 * RB_ERR_CLOSED after rb_close. */
int rb_wake(rb_client* c);
/* The last INFO the broker sent (free it with rb_server_info_free); its
 * self.id is "" when none came. */
int rb_server_info_get(rb_client* c, rb_server_info** out);
void rb_server_info_free(rb_server_info* info);
/* Closes and frees the client. */
void rb_close(rb_client* c);
const char* rb_last_error(void);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif

#endif
