// SPDX-License-Identifier: Apache-2.0
// Subscribes, publishes one message to itself and prints it: the smallest
// C++ program against an installed librdmabroker (find_package). Built at
// C++17 and at C++20 (scripts/package.sh): it uses what a C++17 program
// reaches for, a byte vector as a payload, headers walked with a range-for,
// views compared, and under C++20 a std::span.
//   consumer_cpp URL
#include <rdmabroker/client.hpp>

#include <chrono>
#include <cstddef>
#include <iostream>
#include <string_view>
#include <vector>
#if __cplusplus >= 202002L
#include <span>
#endif

int main(int argc, char** argv) {
  if (argc == 2 && std::string_view(argv[1]) == "--standard") {  // the standard it was built at
    std::cout << __cplusplus << "\n";
    return 0;
  }
  if (argc != 2) {
    std::cerr << "usage: consumer_cpp URL\n";
    return 2;
  }
  auto client = rdmabroker::Client::connect(argv[1]);
  if (!client) {
    std::cerr << "consumer_cpp: " << client.error().message << "\n";
    return 1;
  }
  auto sub = client.value()->subscribe("consumer.cpp");
  if (!sub || !client.value()->flush(std::chrono::seconds(10)) ||
      !client.value()->publish("consumer.cpp", std::string_view("hello from C++"))) {
    std::cerr << "consumer_cpp: subscribe or publish failed\n";
    return 1;
  }
  auto m = sub.value()->next(std::chrono::seconds(10));
  if (!m) {
    std::cerr << "consumer_cpp: " << m.error().message << "\n";
    return 1;
  }
  std::cout << m->data() << "\n";

  // Bytes and headers the C++17 way (and a std::span under C++20).
  const std::vector<std::byte> bytes{std::byte{'o'}, std::byte{'k'}};
  rdmabroker::ByteView payload = bytes;
#if __cplusplus >= 202002L
  payload = std::span<const std::byte>(bytes);
#endif
  rdmabroker::Headers headers{{"Trace-Id", "7"}};
  if (!client.value()->publish("consumer.cpp", headers, payload)) return 1;
  auto h = sub.value()->next(std::chrono::seconds(10));
  if (!h || h->headers != headers || h->data() != "ok") {
    std::cerr << "consumer_cpp: the message with headers did not arrive as sent\n";
    return 1;
  }
  for (const auto& [name, value] : h->headers)
    std::cerr << "consumer_cpp: header " << name << ": " << value << "\n";
  client.value()->close();
  return 0;
}
