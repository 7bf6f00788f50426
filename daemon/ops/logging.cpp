// SPDX-License-Identifier: Apache-2.0
#include "ops/logging.hpp"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/sinks/systemd_sink.h>
#include <spdlog/spdlog.h>

#include <cstdlib>

namespace rdmabroker::daemon {

namespace {

/// %j: the message as the body of a JSON string (quotes, backslashes and
/// control characters escaped), so format: json stays parseable whatever a
/// log line says.
class JsonEscapedMessage final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    static constexpr char kHex[] = "0123456789abcdef";
    for (const char ch : std::string_view(msg.payload.data(), msg.payload.size())) {
      const auto c = static_cast<unsigned char>(ch);
      if (c == '"' || c == '\\') {
        dest.push_back('\\');
        dest.push_back(ch);
      } else if (c < 0x20) {
        const char esc[] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 15]};
        dest.append(esc, esc + sizeof esc);
      } else {
        dest.push_back(ch);
      }
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonEscapedMessage>();
  }
};

bool g_journald = false;

void apply_format(config::LogFormat format) {
  auto f = std::make_unique<spdlog::pattern_formatter>();
  f->add_flag<JsonEscapedMessage>('j');
  if (format == config::LogFormat::kJson) {
    f->set_pattern(R"({"time":"%Y-%m-%dT%H:%M:%S.%e%z","level":"%l","thread":%t,"msg":"%j"})");
  } else if (g_journald) {
    f->set_pattern("[%t] %v");  // journald adds time and priority itself
  } else {
    f->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ [%t] %v");
  }
  spdlog::set_formatter(std::move(f));
}

}  // namespace

bool started_by_systemd() { return std::getenv("INVOCATION_ID") != nullptr; }

std::string setup_logging(const config::LogSettings& settings) {
  g_journald = settings.target == config::LogTarget::kJournald ||
               (settings.target == config::LogTarget::kAuto && started_by_systemd());
  std::shared_ptr<spdlog::logger> logger;
  if (g_journald) {
    logger = std::make_shared<spdlog::logger>(
        "rdmabrokerd", std::make_shared<spdlog::sinks::systemd_sink_mt>("rdmabrokerd"));
  } else {
    // Colours on a terminal, unless NO_COLOR is set to anything (no-color.org).
    const char* no_color = std::getenv("NO_COLOR");
    logger = spdlog::stdout_color_mt("rdmabrokerd", no_color != nullptr && no_color[0] != '\0'
                                                        ? spdlog::color_mode::never
                                                        : spdlog::color_mode::automatic);
  }
  spdlog::set_default_logger(logger);
  apply_log_settings(settings);
  spdlog::flush_on(spdlog::level::info);
  return g_journald ? "journald" : "console";
}

void apply_log_settings(const config::LogSettings& settings) {
  spdlog::set_level(spdlog::level::from_str(settings.level));
  apply_format(settings.format);
}

}  // namespace rdmabroker::daemon
