// SPDX-License-Identifier: Apache-2.0
// Subscribes, publishes one message to itself and prints it: the smallest
// C++ program against an installed librdmabroker (find_package).
//   consumer_cpp URL
#include <rdmabroker/client.hpp>

#include <chrono>
#include <iostream>
#include <string_view>

int main(int argc, char** argv) {
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
  client.value()->close();
  return 0;
}
