// SPDX-License-Identifier: Apache-2.0
// What the broker reads from disk at start, on arbitrary bytes: a stream's
// directory (meta.json, two segment files) opened by FileStore, every
// message it then reports live read back, and a durable consumer's state
// file loaded. Asserts: a clean refusal or a store whose counts agree with
// what can be read, never a crash; what the store reports it holds is
// readable or reported damaged (kCorrupt), nothing else.
//
// The input is cut at "@@@@" into meta.json, segment 1 (sequence 1), segment
// 2 (sequence 5) and consumers/d.json; an empty part leaves that file out.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.hpp"
#include "store/file_store.hpp"
#include "stream/consumer_state.hpp"

namespace fs = std::filesystem;
namespace store = rdmabroker::daemon::store;

namespace {

const std::string& directory() {
  static const std::string dir = "/dev/shm/rdmabroker-fuzz-store-" + std::to_string(::getpid());
  return dir;
}

void put(const std::string& path, std::string_view bytes) {
  if (bytes.empty()) return;
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string_view parts[4];
  for (auto& part : parts) {
    const auto cut = text.find("@@@@");
    part = text.substr(0, cut);
    text = cut == std::string_view::npos ? std::string_view{} : text.substr(cut + 4);
  }
  const std::string& dir = directory();
  fs::remove_all(dir);
  fs::create_directories(dir + "/consumers");
  put(dir + "/meta.json", parts[0]);
  put(dir + "/00000000000000000001.seg", parts[1]);
  put(dir + "/00000000000000000005.seg", parts[2]);
  put(dir + "/consumers/d.json", parts[3]);

  store::RecoveryReport report;
  auto opened = store::FileStore::open({dir, 4096, {}}, 0, &report);
  if (!opened.ok()) {
    FUZZ_CHECK(!opened.error().message.empty());
  } else {
    store::FileStore& s = *opened.value();
    const store::StoreStats st = s.stats();
    FUZZ_CHECK(st.last_sequence <= store::kMaxSequence);
    std::uint64_t live = 0;
    std::vector<std::byte> buf;
    for (auto seq = s.next_live(1); seq; seq = s.next_live(*seq + 1)) {
      ++live;
      FUZZ_CHECK(*seq >= st.first_sequence && *seq <= st.last_sequence);
      buf.resize(s.length_of(*seq).value_or(0));
      auto r = s.read(*seq, buf);
      FUZZ_CHECK(r.ok() || r.error().code == store::StoreErrc::kCorrupt);
      if (r.ok()) FUZZ_CHECK(r->sequence == *seq);
      if (live > 100000) break;
    }
    FUZZ_CHECK(live == st.messages);
    FUZZ_CHECK(s.live_from(1) == st.messages);
    // Appending after whatever was found gives a sequence never seen.
    const std::string subject = "x";
    auto appended = s.append({subject, {}, {}}, 1);
    if (appended.ok()) FUZZ_CHECK(appended.value() > st.last_sequence);
  }
  std::vector<std::string> problems;
  for (const auto& [name, state] : rdmabroker::daemon::load_consumers(dir, problems)) {
    FUZZ_CHECK(name == "d");
    (void)state;
  }
  return 0;
}
