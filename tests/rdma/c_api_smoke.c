// SPDX-License-Identifier: Apache-2.0
/* Exercises librdmabroker's C API from C (so the header is checked as C):
 * connect, subscribe (sync and callback), publish, flush, receive, queue
 * groups, request/reply (answered, no responders; with headers), a callback
 * that reads messages in place (rb_subscribe_view), close, connecting with
 * options (rb_connect_with), a polled client (rb_options.polled, rb_poll).
 *   c_api_smoke URL            -> exit 0 when every step worked, else 1 with a message
 *   c_api_smoke URL --streams  -> the same for streams (check_streams): the
 *                                 broker has stream C on c.stream.> */
#include <rdmabroker/rdmabroker.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* Written by the client's I/O thread, read by main. */
static atomic_int callback_count = 0;

static void on_message(const rb_message* m, void* user) {
  (void)user;
  if (m->len == 5 && memcmp(m->data, "hello", 5) == 0) atomic_fetch_add(&callback_count, 1);
}

/* A responder: answers each request with "pong", and one that came with a
 * Trace-Id header with the same header and Answered-By. `user` is the client. */
static void on_request(const rb_message* m, void* user) {
  if (m->reply[0] == '\0') return;
  const char* trace = rb_message_header(m, "trace-id");
  if (trace == NULL) {
    rb_publish((rb_client*)user, m->reply, "pong", 4);
    return;
  }
  rb_header fields[] = {{"Trace-Id", trace}, {"Answered-By", "c_api_smoke"}};
  rb_publish_headers((rb_client*)user, m->reply, NULL, fields, 2, "pong", 4);
}

/* In place: subject, reply, a header and the payload, read by their lengths. */
static atomic_int view_count = 0;

/* CLOCK_MONOTONIC in nanoseconds: the clock of rb_view_received_ns. */
static int64_t monotonic_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void on_view(const rb_message_view* v, void* user) {
  (void)user;
  const int64_t now = monotonic_ns();
  const int64_t received = rb_view_received_ns(v);
  size_t n = 0;
  const char* trace = rb_view_header(v, "TRACE-ID", &n);
  if (v->subject_len == 6 && memcmp(v->subject, "c.view", 6) == 0 && v->reply_len == 5 &&
      memcmp(v->reply, "c.ans", 5) == 0 && v->len == 4 && memcmp(v->data, "seen", 4) == 0 && trace != NULL &&
      n == 3 && memcmp(trace, "abc", 3) == 0 && rb_view_header(v, "missing", &n) == NULL &&
      rb_view_relay_ns(v) > 0 && received <= now && received > now - 60 * (int64_t)1000000000 &&
      rb_view_relay_ns(NULL) == 0)
    atomic_fetch_add(&view_count, 1);
}

/* A polled client's callback: runs inside rb_poll, on main's thread. */
static int polled_count = 0;

static void on_polled(const rb_message_view* v, void* user) {
  (void)user;
  if (v->len == 6 && memcmp(v->data, "polled", 6) == 0) ++polled_count;
}

static void wait_for(atomic_int* count) {
  for (int i = 0; i < 1000 && atomic_load(count) == 0; ++i) {
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

#define CHECK(call)                                                         \
  do {                                                                      \
    int rc_ = (call);                                                       \
    if (rc_ != RB_OK) {                                                     \
      fprintf(stderr, "%s failed (%d): %s\n", #call, rc_, rb_last_error()); \
      return 1;                                                             \
    }                                                                       \
  } while (0)

/* Streams (the broker has stream C on c.stream.>): acknowledged publishes,
 * a durable consumer that takes them in order and acknowledges each, a NAK
 * delivered again with its count one higher, and typed refusals. */
static int check_streams(const char* url) {
  rb_client* c = NULL;
  CHECK(rb_connect(url, NULL, &c));
  rb_pub_ack ack;
  for (int i = 1; i <= 3; ++i) {
    char text[16];
    snprintf(text, sizeof text, "s%d", i);
    CHECK(rb_publish_acked(c, "c.stream.x", NULL, 0, text, strlen(text), 10000, &ack));
    if (strcmp(ack.stream, "C") != 0 || ack.sequence != (uint64_t)i || ack.duplicate != 0) {
      fprintf(stderr, "PUB_ACK %d: stream '%s' sequence %llu\n", i, ack.stream,
              (unsigned long long)ack.sequence);
      return 1;
    }
  }
  if (rb_publish_acked(c, "c.unstored", NULL, 0, "x", 1, 10000, &ack) != RB_ERR_NO_STREAM) {
    fprintf(stderr, "expected no stream for c.unstored, got: %s\n", rb_last_error());
    return 1;
  }
  rb_consumer* k = NULL;
  if (rb_consume(c, "NOPE", NULL, 10000, &k, NULL) != RB_ERR_NO_STREAM) {
    fprintf(stderr, "expected no stream NOPE, got: %s\n", rb_last_error());
    return 1;
  }
  rb_consumer_options o;
  rb_consumer_options_init(&o);
  o.durable = "c-reader";
  uint64_t pending = 0;
  CHECK(rb_consume(c, "C", &o, 10000, &k, &pending));
  if (pending != 3) {
    fprintf(stderr, "a new consumer has %llu to deliver, expected 3\n", (unsigned long long)pending);
    return 1;
  }
  rb_message* m = NULL;
  CHECK(rb_consumer_next(k, 10000, &m));
  if (m->stream_sequence != 1 || m->deliveries != 1 || m->len != 2 || memcmp(m->data, "s1", 2) != 0) {
    fprintf(stderr, "first stored message wrong (sequence %llu)\n", (unsigned long long)m->stream_sequence);
    return 1;
  }
  CHECK(rb_consumer_nak(k, m));
  rb_message_free(m);
  int acked = 0, redelivered = 0;
  while (acked < 3) {
    CHECK(rb_consumer_next(k, 10000, &m));
    if (m->stream_sequence == 1 && m->deliveries == 2) ++redelivered;
    CHECK(rb_consumer_ack(k, m));
    rb_message_free(m);
    ++acked;
  }
  if (redelivered != 1) {
    fprintf(stderr, "the NAKed message came back %d times with deliveries 2\n", redelivered);
    return 1;
  }
  if (rb_consumer_next(k, 200, &m) != RB_ERR_TIMEOUT) {
    fprintf(stderr, "a fourth message after three acknowledged: %s\n", rb_last_error());
    return 1;
  }
  rb_consumer_close(k);
  rb_close(c);
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  if (argc == 3 && strcmp(argv[2], "--streams") == 0) {
    if (check_streams(argv[1]) != 0) return 1;
    puts("c_api_smoke: streams ok");
    return 0;
  }
  rb_client* c = NULL;
  CHECK(rb_connect(argv[1], NULL, &c));
  rb_subscription* sub = NULL;
  uint32_t sid = 0;
  CHECK(rb_subscribe_sync(c, "c.api", &sub));
  CHECK(rb_subscribe(c, "c.api", on_message, NULL, &sid));
  CHECK(rb_flush(c, 10000));
  CHECK(rb_publish(c, "c.api", "hello", 5));
  CHECK(rb_flush(c, 10000));
  rb_message* m = NULL;
  CHECK(rb_next_message(sub, 10000, &m));
  if (strcmp(m->subject, "c.api") != 0 || m->len != 5 || memcmp(m->data, "hello", 5) != 0) {
    fprintf(stderr, "wrong message\n");
    return 1;
  }
  rb_message_free(m);
  /* The callback subscription's copy may arrive in a later SEND: wait for it
   * (up to 10 s) before unsubscribing, which drops anything still in flight. */
  wait_for(&callback_count);
  /* Errors come back as codes with a message. */
  if (rb_publish(c, "bad..subject", "x", 1) != RB_ERR_INVALID_ARGUMENT ||
      strstr(rb_last_error(), "invalid subject") == NULL) {
    fprintf(stderr, "expected an invalid-subject error, got: %s\n", rb_last_error());
    return 1;
  }
  /* Request/reply through a queue-group responder on the same connection. */
  uint32_t responder = 0;
  CHECK(rb_queue_subscribe(c, "c.svc", "responders", on_request, c, &responder));
  CHECK(rb_flush(c, 10000));
  rb_message* reply = NULL;
  CHECK(rb_request(c, "c.svc", "ping", 4, 10000, &reply));
  if (reply->len != 4 || memcmp(reply->data, "pong", 4) != 0) {
    fprintf(stderr, "wrong reply\n");
    return 1;
  }
  if (reply->header_count != 0) {
    fprintf(stderr, "a reply without headers has %zu\n", reply->header_count);
    return 1;
  }
  rb_message_free(reply);
  /* Headers both ways: the request's reach the responder, the reply's come back in order. */
  rb_header trace[] = {{"Trace-Id", "4bf92f35"}};
  CHECK(rb_request_headers(c, "c.svc", trace, 1, "ping", 4, 10000, &reply));
  if (reply->header_count != 2 || strcmp(reply->headers[0].name, "Trace-Id") != 0 ||
      strcmp(reply->headers[0].value, "4bf92f35") != 0 ||
      strcmp(rb_message_header(reply, "ANSWERED-BY"), "c_api_smoke") != 0 ||
      rb_message_header(reply, "missing") != NULL) {
    fprintf(stderr, "reply headers wrong (%zu)\n", reply->header_count);
    return 1;
  }
  rb_message_free(reply);
  rb_header bad[] = {{"No Spaces", "x"}};
  if (rb_publish_headers(c, "c.svc", NULL, bad, 1, "x", 1) != RB_ERR_INVALID_ARGUMENT ||
      strstr(rb_last_error(), "invalid header name") == NULL) {
    fprintf(stderr, "expected an invalid header name, got: %s\n", rb_last_error());
    return 1;
  }
  if (rb_request(c, "c.nobody", "x", 1, 10000, &reply) != RB_ERR_NO_RESPONDERS) {
    fprintf(stderr, "expected no responders, got: %s\n", rb_last_error());
    return 1;
  }
  /* A publish with a reply subject reaches a queue subscriber with it. */
  rb_subscription* q = NULL;
  CHECK(rb_queue_subscribe_sync(c, "c.q", "g", &q));
  CHECK(rb_flush(c, 10000));
  CHECK(rb_publish_request(c, "c.q", "c.answer.here", "?", 1));
  CHECK(rb_next_message(q, 10000, &m));
  if (strcmp(m->reply, "c.answer.here") != 0) {
    fprintf(stderr, "reply subject lost: '%s'\n", m->reply);
    return 1;
  }
  rb_message_free(m);
  uint32_t viewer = 0;
  CHECK(rb_queue_subscribe_view(c, "c.view", "viewers", on_view, NULL, &viewer));
  CHECK(rb_flush(c, 10000));
  rb_header abc[] = {{"Trace-Id", "abc"}};
  CHECK(rb_publish_headers(c, "c.view", "c.ans", abc, 1, "seen", 4));
  wait_for(&view_count);
  if (atomic_load(&view_count) != 1) {
    fprintf(stderr, "the view callback saw %d matching messages, expected 1\n", atomic_load(&view_count));
    return 1;
  }
  CHECK(rb_unsubscribe(c, viewer));
  CHECK(rb_unsubscribe(c, rb_subscription_sid(q)));
  rb_subscription_free(q);
  CHECK(rb_unsubscribe(c, responder));
  CHECK(rb_unsubscribe(c, sid));
  CHECK(rb_unsubscribe(c, rb_subscription_sid(sub)));
  CHECK(rb_flush(c, 10000));
  rb_subscription_free(sub);
  if (rb_wake(c) != RB_ERR_INVALID_ARGUMENT) {
    fprintf(stderr, "rb_wake on a client with an I/O thread: %s\n", rb_last_error());
    return 1;
  }
  rb_close(c);
  if (atomic_load(&callback_count) != 1) {
    fprintf(stderr, "callback saw %d messages, expected 1\n", atomic_load(&callback_count));
    return 1;
  }
  /* rb_connect_with: options initialized, then the ones wanted; a struct
   * whose size was never set, or a negative timeout, is refused. */
  rb_options o;
  rb_options_init(&o);
  if (o.size != sizeof(rb_options) || o.reconnect != 0 || o.on_error != NULL) {
    fprintf(stderr, "rb_options_init left something set\n");
    return 1;
  }
  o.reconnect = 1;
  o.connect_timeout_ms = 15000;
  o.publish_timeout_ms = 10000;
  rb_client* c2 = NULL;
  CHECK(rb_connect_with(argv[1], &o, &c2));
  CHECK(rb_publish(c2, "c.options", "x", 1));
  CHECK(rb_flush(c2, 10000));
  rb_close(c2);
  rb_options unset;
  memset(&unset, 0, sizeof unset);
  if (rb_connect_with(argv[1], &unset, &c2) != RB_ERR_INVALID_ARGUMENT ||
      strstr(rb_last_error(), "options.size") == NULL) {
    fprintf(stderr, "expected options.size to be refused, got: %s\n", rb_last_error());
    return 1;
  }
  o.connect_timeout_ms = -1;
  if (rb_connect_with(argv[1], &o, &c2) != RB_ERR_INVALID_ARGUMENT) {
    fprintf(stderr, "expected a negative timeout to be refused\n");
    return 1;
  }
  /* A program built against an older header, whose struct ends before
   * `polled`: its initialization writes no byte past that struct, and it
   * connects with the defaults of the fields it does not have. */
  {
    union {
      rb_options options;
      unsigned char bytes[sizeof(rb_options) + 16];
    } older;
    const size_t older_size = offsetof(rb_options, polled);
    memset(older.bytes, 0xAB, sizeof older.bytes);
    rb_options_init_sized(&older.options, older_size);
    if (older.options.size != older_size || older.options.reconnect != 0 ||
        older.options.tls_server_name != NULL) {
      fprintf(stderr, "rb_options_init_sized did not set the older struct\n");
      return 1;
    }
    for (size_t i = older_size; i < sizeof older.bytes; ++i) {
      if (older.bytes[i] != 0xAB) {
        fprintf(stderr, "rb_options_init_sized wrote byte %zu of a %zu-byte struct\n", i, older_size);
        return 1;
      }
    }
    rb_client* c3 = NULL;
    CHECK(rb_connect_with(argv[1], &older.options, &c3));
    CHECK(rb_publish(c3, "c.options", "y", 1));
    CHECK(rb_flush(c3, 10000));
    rb_close(c3);
  }
  /* A polled client: no I/O thread; its callback runs inside rb_poll. */
  rb_options po;
  rb_options_init(&po);
  po.polled = 1;
  rb_client* p = NULL;
  CHECK(rb_connect_with(argv[1], &po, &p));
  uint32_t polled_sid = 0;
  CHECK(rb_subscribe_view(p, "c.polled", on_polled, NULL, &polled_sid));
  CHECK(rb_flush(p, 10000));
  CHECK(rb_publish(p, "c.polled", "polled", 6));
  for (int i = 0; i < 10000 && polled_count == 0; ++i) CHECK(rb_poll(p, 1000, NULL));
  if (polled_count != 1) {
    fprintf(stderr, "the polled client's callback saw %d messages, expected 1\n", polled_count);
    return 1;
  }
  size_t delivered = 0;
  if (rb_poll(p, 0, &delivered) != RB_OK || delivered != 0) {
    fprintf(stderr, "an idle poll delivered %zu: %s\n", delivered, rb_last_error());
    return 1;
  }
  /* rb_wake before a long poll: it returns at once, having delivered nothing. */
  CHECK(rb_wake(p));
  const int64_t before_wake = monotonic_ns();
  delivered = 1;
  CHECK(rb_poll(p, 60 * 1000000L, &delivered));
  if (delivered != 0 || monotonic_ns() - before_wake > 10 * 1000000000LL) {
    fprintf(stderr, "a woken poll delivered %zu after %lld ms\n", delivered,
            (long long)((monotonic_ns() - before_wake) / 1000000));
    return 1;
  }
  rb_close(p);
  puts("c_api_smoke: ok");
  return 0;
}
