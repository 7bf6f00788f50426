// Which connections subscribe to which subject. Shared by all workers: lookups
// take a shared lock, subscribe/unsubscribe an exclusive one. Version 1 of the
// protocol routes exact subjects only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace rdmabroker::daemon {

struct Subscriber {
  std::uint32_t worker = 0;        // index of the worker that owns the connection
  std::uint64_t connection = 0;    // broker-wide connection id
  std::uint32_t sid = 0;           // the client's subscription id
  std::uint32_t slot = 0;          // the connection's ConnectionSlots slot
  bool operator==(const Subscriber&) const = default;
};

class SubscriptionIndex {
 public:
  void add(std::string_view subject, const Subscriber& s);
  /// Removes one subscription; returns false if it was not there.
  bool remove(std::string_view subject, const Subscriber& s);
  /// Appends every subscriber of `subject` to `out` (cleared first).
  void match(std::string_view subject, std::vector<Subscriber>& out) const;
  std::size_t size() const;

 private:
  // Transparent hashing: lookups by string_view without building a std::string.
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  mutable std::shared_mutex mutex_;
  std::unordered_map<std::string, std::vector<Subscriber>, Hash, std::equal_to<>> by_subject_;
  std::size_t count_ = 0;
};

}  // namespace rdmabroker::daemon
