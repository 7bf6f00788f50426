// SPDX-License-Identifier: Apache-2.0
// Names the calling thread, so that `top -H`, `ps -L`, perf and gdb show
// which part of the broker or the library a thread is ("rb-worker-1").
#pragma once

#include <pthread.h>

#include <string>
#include <string_view>

namespace rdmabroker {

/// Linux keeps 15 bytes of a thread's name: longer names are cut.
inline void name_this_thread(std::string_view name) {
  std::string n(name.substr(0, 15));
  ::pthread_setname_np(::pthread_self(), n.c_str());
}

}  // namespace rdmabroker
