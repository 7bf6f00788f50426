// SPDX-License-Identifier: Apache-2.0
// FileStore: opening a store directory and recovering its index from the
// segment files, CRC by CRC.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "store/file_store.hpp"

namespace rdmabroker::daemon::store {
namespace {

constexpr const char* kMeta = "meta.json";

/// A segment file mapped for reading while it is scanned.
class Mapping {
 public:
  Mapping(const std::string& path, std::size_t size) : size_(size) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd && size > 0) {
      void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.get(), 0);
      if (p != MAP_FAILED) data_ = static_cast<const std::byte*>(p);
    }
  }
  ~Mapping() {
    if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  bool ok() const { return data_ != nullptr || size_ == 0; }
  std::span<const std::byte> bytes() const { return {data_, data_ == nullptr ? 0 : size_}; }

 private:
  const std::byte* data_ = nullptr;
  std::size_t size_;
};

/// The offset of the first whole record after `from` with a sequence above
/// `after`, or bytes.size() if there is none: where a scan resumes past damage.
std::size_t resync(std::span<const std::byte> bytes, std::size_t from, std::uint64_t after) {
  for (std::size_t at = from; at + kRecordHeaderBytes <= bytes.size(); ++at) {
    RecordView r;
    std::size_t length = 0;
    if (parse_record(bytes.subspan(at), r, length) == ParseOutcome::kOk && r.sequence > after) return at;
  }
  return bytes.size();
}

/// `rest`, the end of the newest segment, is what a crash leaves of a write
/// it interrupted: zeros (blocks allocated, never written), or the start of
/// record `expected` cut short.
bool looks_torn(std::span<const std::byte> rest, std::uint64_t expected) {
  if (std::all_of(rest.begin(), rest.end(), [](std::byte b) { return b == std::byte{0}; })) return true;
  RecordView r;
  std::size_t length = 0;
  if (parse_record(rest, r, length) != ParseOutcome::kShort) return false;
  if (rest.size() < 16) return true;  // not even its sequence: nothing to check it by
  std::uint64_t sequence = 0;
  std::memcpy(&sequence, rest.data() + 8, sizeof sequence);
  return sequence == expected;
}

}  // namespace

StoreResult<std::unique_ptr<FileStore>> FileStore::open(const FileStoreOptions& options, std::int64_t now_ns,
                                                        RecoveryReport* report) {
  RecoveryReport local;
  std::unique_ptr<FileStore> store(new FileStore(options));
  if (auto s = store->recover(now_ns, report != nullptr ? *report : local); !s) return s.error();
  return store;
}

StoreStatus FileStore::recover(std::int64_t now_ns, RecoveryReport& report) {
  namespace fs = std::filesystem;
  const std::string& dir = options_.directory;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return StoreError{StoreErrc::kIo, "creating " + dir + ": " + ec.message()};
  const std::string meta_path = dir + "/" + kMeta;
  if (std::ifstream meta(meta_path); meta) {
    auto j = nlohmann::json::parse(meta, nullptr, false);
    const auto number = [&](const char* key) { return j.contains(key) && j[key].is_number_unsigned(); };
    if (j.is_discarded() || !number("first_sequence") ||
        (j.contains("reserved_through") && !number("reserved_through"))) {
      // Guessing would bring purged messages back: the operator decides.
      return StoreError{StoreErrc::kCorrupt,
                        meta_path + " is damaged (it should hold first_sequence and reserved_through)"};
    }
    floor_ = purged_below_ = std::max<std::uint64_t>(1, j["first_sequence"].get<std::uint64_t>());
    reserved_ = j.value("reserved_through", std::uint64_t{0});
    if (floor_ > kMaxSequence || reserved_ > kMaxSequence) {
      return StoreError{StoreErrc::kCorrupt,
                        meta_path + " names sequence " + std::to_string(std::max(floor_, reserved_)) +
                            ", beyond the highest a stream takes (2^62): a damaged file"};
    }
  }
  std::vector<std::pair<std::uint64_t, std::string>> files;
  for (const auto& f : fs::directory_iterator(dir, ec)) {
    const std::uint64_t first = Segment::first_sequence_of(f.path().filename().string());
    if (first > kMaxSequence) {
      return StoreError{StoreErrc::kCorrupt,
                        f.path().string() + " is named for sequence " + std::to_string(first) +
                            ", beyond the highest a stream takes (2^62): not a segment this "
                            "broker wrote; move it away"};
    }
    if (first > 0) files.emplace_back(first, f.path().string());
  }
  if (ec) return StoreError{StoreErrc::kIo, "listing " + dir + ": " + ec.message()};
  std::sort(files.begin(), files.end());
  for (std::size_t i = 0; i < files.size(); ++i) {
    auto segment = Segment::open(files[i].second, files[i].first);
    if (!segment) return segment.error();
    const std::uint64_t next_first = i + 1 < files.size() ? files[i + 1].first : kMaxSequence + 1;
    if (auto s = scan(std::move(*segment), next_first, report); !s) return s;
  }
  report.segments = files.size();
  // What a crash may have handed out and lost (reserved, never closed) is
  // not handed out again: the next message goes on after the reservation.
  if (reserved_ > last_sequence_ && reserved_ >= floor_) {
    report.problems.push_back("sequences " + std::to_string(last_sequence_ + 1) + ".." +
                              std::to_string(reserved_) +
                              " were reserved when the stream last stopped without closing: it goes on at " +
                              std::to_string(reserved_ + 1) + ", so no sequence is given twice");
  }
  last_sequence_ = std::max({last_sequence_, floor_ - 1, reserved_});
  floor_ = next_live(floor_).value_or(last_sequence_ + 1);
  durable_ = last_sequence_;
  const std::uint64_t removed_before = removed_by_limits_;
  set_limits(options_.limits);
  expire(now_ns);
  report.removed_by_limits = removed_by_limits_ - removed_before;
  report.corrupt_records = corrupt_records_;
  report.corrupt_bytes = corrupt_bytes_;
  report.torn_bytes = torn_bytes_;
  return std::monostate{};
}

StoreStatus FileStore::scan(Segment segment, std::uint64_t next_first, RecoveryReport& report) {
  // A segment holds the sequences from its name's up to the next segment's:
  // a record beyond them is damage, or the index would say one sequence is
  // in two files (and find() look in the other).
  const bool last = next_first > kMaxSequence;
  const std::string path = segment.path();
  const std::uint64_t first = segment.first_sequence();
  const Mapping map(path, segment.size());
  if (!map.ok()) return io_error("mapping", path, errno);
  segments_.push_back({std::move(segment), {}, 0});
  const auto bytes = map.bytes();
  std::size_t at = 0;
  while (at < bytes.size()) {
    RecordView r;
    std::size_t length = 0;
    const std::uint64_t expected = first + segments_.back().entries.size();
    if (parse_record(bytes.subspan(at), r, length) == ParseOutcome::kOk && r.sequence >= expected &&
        r.sequence > last_sequence_ && r.sequence < next_first) {
      index(r.sequence, r.time_ns, r.subject, at, length);
      ++report.records;
      at += length;
      continue;
    }
    const std::size_t next = resync(bytes, at + 1, std::max(last_sequence_, expected - 1));
    if (next == bytes.size() && last && !looks_torn(bytes.subspan(at), expected) && at == 0) {
      // Not one whole record, and not the start of one cut short: a file the
      // broker did not write. It is never modified; the operator decides.
      return StoreError{StoreErrc::kCorrupt, path + " holds no record this broker wrote (" +
                                                 std::to_string(bytes.size()) +
                                                 " bytes, none a record): move it away"};
    }
    if (next == bytes.size() && last && looks_torn(bytes.subspan(at), expected)) {
      // Nothing whole after it in the newest segment: the write a crash interrupted.
      torn_bytes_ += bytes.size() - at;
      report.problems.push_back("cut " + std::to_string(bytes.size() - at) +
                                " bytes of an unfinished write off " + path + " at offset " +
                                std::to_string(at));
      if (auto s = segments_.back().file.truncate(at); !s) return s;
      break;
    }
    ++corrupt_records_;
    corrupt_bytes_ += next - at;
    report.problems.push_back("skipped " + std::to_string(next - at) + " damaged bytes of " + path +
                              " at offset " + std::to_string(at) + " (their CRC does not match)");
    at = next;
  }
  return std::monostate{};
}

StoreStatus FileStore::write_meta(std::uint64_t first_sequence, std::uint64_t reserved_through) {
  return replace_file(
      options_.directory + "/" + kMeta,
      nlohmann::json{{"first_sequence", first_sequence}, {"reserved_through", reserved_through}}.dump() +
          "\n");
}

}  // namespace rdmabroker::daemon::store
