// SPDX-License-Identifier: Apache-2.0
// An invariant a fuzz target asserts: a failure aborts, so libFuzzer saves
// the input that broke it (ASan and UBSan abort on their own findings).
#pragma once
#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond)                                                                \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)
