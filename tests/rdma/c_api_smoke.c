/* Exercises librdmabroker's C API from C (so the header is checked as C):
 * connect, subscribe (sync and callback), publish, flush, receive, close.
 *   c_api_smoke URL   -> exit 0 when every step worked, else 1 with a message */
#include <rdmabroker/rdmabroker.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* Written by the client's I/O thread, read by main. */
static atomic_int callback_count = 0;

static void on_message(const rb_message* m, void* user) {
  (void)user;
  if (m->len == 5 && memcmp(m->data, "hello", 5) == 0) atomic_fetch_add(&callback_count, 1);
}

#define CHECK(call)                                                          \
  do {                                                                       \
    int rc_ = (call);                                                        \
    if (rc_ != RB_OK) {                                                      \
      fprintf(stderr, "%s failed (%d): %s\n", #call, rc_, rb_last_error()); \
      return 1;                                                              \
    }                                                                        \
  } while (0)

int main(int argc, char** argv) {
  if (argc < 2) return 2;
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
  for (int i = 0; i < 1000 && atomic_load(&callback_count) == 0; ++i) {
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  /* Errors come back as codes with a message. */
  if (rb_publish(c, "bad..subject", "x", 1) != RB_ERR_INVALID_ARGUMENT || strstr(rb_last_error(), "invalid subject") == NULL) {
    fprintf(stderr, "expected an invalid-subject error, got: %s\n", rb_last_error());
    return 1;
  }
  CHECK(rb_unsubscribe(c, sid));
  CHECK(rb_unsubscribe(c, rb_subscription_sid(sub)));
  CHECK(rb_flush(c, 10000));
  rb_subscription_free(sub);
  rb_close(c);
  if (atomic_load(&callback_count) != 1) {
    fprintf(stderr, "callback saw %d messages, expected 1\n", atomic_load(&callback_count));
    return 1;
  }
  puts("c_api_smoke: ok");
  return 0;
}
