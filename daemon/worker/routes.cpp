// SPDX-License-Identifier: Apache-2.0
// Worker: the routes it dials (broker/route_events.hpp). A route is a
// connection of this worker like any other, made by dialing: the RDMA
// dialer or the TCP port makes it, the frame handler's RouteFrames logs it
// in and keeps its subscriptions, the router takes what it brings.
#include <spdlog/spdlog.h>

#include "worker/worker.hpp"

namespace rdmabroker::daemon {

void Worker::on_command(DialRouteCommand& cmd) {
  if (stopping_) return;  // the routes stop before the workers
  if (cmd.dial.not_before > ctx_.now) {
    waiting_dials_.push_back(std::move(cmd.dial));
    return;
  }
  dial_route(std::move(cmd.dial));
}

void Worker::on_command(EndRouteCommand& cmd) {
  std::erase_if(waiting_dials_, [&](const RouteDial& d) { return d.route == cmd.route; });
  if (dialer_) dialer_->cancel(cmd.route);
  if (tcp_port_ != nullptr) tcp_port_->cancel_dial(cmd.route);
  connections_.for_each([&](Connection& c) {
    if (!c.dialed || c.dialed->dial.route != cmd.route) return;
    c.dialed->removed = true;
    connections_.close(c, CloseReason::kClientClose, proto::ErrorCode::kServerShutdown);
  });
}

void Worker::dial_route(RouteDial dial) {
  auto url = parse_url(dial.url);
  if (!url || (url->scheme != "rdma" && url->scheme != "tcp")) {
    // Checked when the configuration was read: a discovered route's URL was checked at its announcement.
    ctx_.core.routes->route_down(dial.route, RouteEnd::kLost, "not a route URL: " + dial.url);
    return;
  }
  const std::uint64_t id = ctx_.core.next_connection_id.fetch_add(1);
  const std::string peer = url->host + ":" + std::to_string(url->port);
  Admission& admission = *ctx_.core.admission;
  proto::RejectReason why{};
  std::optional<Admission::Eviction> evict;
  const auto slot = admission.reserve(stopping_, {id, ctx_.index, peer}, why, evict);
  if (evict) ctx_.core.workers->evict(*evict);
  if (!slot) {
    ctx_.core.routes->route_down(dial.route, RouteEnd::kLost,
                                 "no connection slot on this broker: " + std::string(proto::to_string(why)));
    return;
  }
  admission.authenticated(*slot);  // its own: never evicted for a client's login
  if (url->scheme == "tcp") {
    TcpPort* port = tcp_port();
    if (port == nullptr) return dial_failed(ctx_, *slot, dial, "tcp: the worker has no TCP port");
    return port->dial(id, *slot, *url, std::move(dial));
  }
  if (!dialer_) return dial_failed(ctx_, *slot, dial, "rdma: this broker serves no RDMA device");
  dialer_->dial(id, *slot, *url, std::move(dial));
}

void Worker::check_routes() {
  if (!waiting_dials_.empty() && !stopping_) {
    std::vector<RouteDial> due;
    std::erase_if(waiting_dials_, [&](RouteDial& d) {
      if (d.not_before > ctx_.now) return false;
      due.push_back(std::move(d));
      return true;
    });
    for (auto& d : due) dial_route(std::move(d));
  }
  if (dialer_) dialer_->check_deadlines();
  if (std::exchange(interest_changed_, false)) frames_.routes().interest_changed();
  frames_.routes().check();
}

TcpPort* Worker::tcp_port() {
  if (tcp_port_ != nullptr) return tcp_port_;
  auto port = TcpPort::create(ctx_, connections_, frames_, epoll_.get(),
                              EpollTags(static_cast<std::uint32_t>(ports_.size())), TcpListeners{});
  if (!port) {
    spdlog::error("worker {}: {}", ctx_.index, port.error().message);
    return nullptr;
  }
  tcp_port_ = port.value().get();
  ports_.push_back(std::move(port.value()));
  epoll_only_ports_ = true;
  return tcp_port_;
}

}  // namespace rdmabroker::daemon
