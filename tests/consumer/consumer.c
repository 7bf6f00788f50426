// SPDX-License-Identifier: Apache-2.0
/* Subscribes, publishes one message to itself and prints it: the smallest C
 * program against an installed librdmabroker, built with
 *   cc consumer.c $(pkg-config --cflags --libs rdmabroker)
 * usage: consumer_c URL */
#include <rdmabroker/rdmabroker.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: consumer_c URL\n");
    return 2;
  }
  rb_client* c = NULL;
  if (rb_connect(argv[1], NULL, &c) != RB_OK) {
    fprintf(stderr, "consumer_c: %s\n", rb_last_error());
    return 1;
  }
  rb_subscription* s = NULL;
  const char* text = "hello from C";
  rb_message* m = NULL;
  if (rb_subscribe_sync(c, "consumer.c", &s) != RB_OK || rb_flush(c, 10000) != RB_OK ||
      rb_publish(c, "consumer.c", text, strlen(text)) != RB_OK || rb_next_message(s, 10000, &m) != RB_OK) {
    fprintf(stderr, "consumer_c: %s\n", rb_last_error());
    rb_close(c);
    return 1;
  }
  printf("%.*s\n", (int)m->len, (const char*)m->data);
  rb_message_free(m);
  rb_subscription_free(s);
  rb_close(c);
  return 0;
}
