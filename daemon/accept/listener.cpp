// SPDX-License-Identifier: Apache-2.0
#include "accept/listener.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "rdmabroker/common/thread_name.hpp"

namespace rdmabroker::daemon {

std::string peer_address(rdma_cm_id* id) {
  sockaddr* sa = rdma_get_peer_addr(id);
  char host[INET6_ADDRSTRLEN] = "?";
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(sa)->sin_addr, host, sizeof host);
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(sa)->sin6_addr, host, sizeof host);
  }
  return std::string(host) + ":" + std::to_string(ntohs(rdma_get_dst_port(id)));
}

Listener::~Listener() { stop(); }

Result<verbs::CmIdPtr> Listener::listen_on(const std::string& address, std::uint16_t port) {
  const std::string where = address + ":" + std::to_string(port);
  auto fail = [&](const char* what) {
    return Error{ErrorKind::kResource,
                 std::string(what) + " for rdma://" + where + ": " + std::strerror(errno)};
  };
  rdma_cm_id* raw = nullptr;
  if (rdma_create_id(channel_.get(), &raw, nullptr, RDMA_PS_TCP) != 0) return fail("rdma_create_id");
  verbs::CmIdPtr id(raw);
  addrinfo hints{};
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  hints.ai_family = AF_UNSPEC;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(address.c_str(), service.c_str(), &hints, &res); rc != 0) {
    return Error{ErrorKind::kInvalidArgument, "listen address " + where + ": " + gai_strerror(rc)};
  }
  const int rc = rdma_bind_addr(id.get(), res->ai_addr);
  freeaddrinfo(res);
  if (rc != 0) {
    if (errno == ENODEV || errno == EADDRNOTAVAIL) {
      return Error{ErrorKind::kResource,
                   "rdma_bind_addr for rdma://" + where + ": " + std::strerror(errno) +
                       " (no RDMA device has this address: check `rdma link` and `ip addr`)"};
    }
    return fail("rdma_bind_addr");
  }
  if (rdma_listen(id.get(), 1024) != 0) return fail("rdma_listen");
  return id;
}

Status Listener::listen() {
  const auto& opt = core_.options;
  auto fail = [&](const char* what) {
    return Error{ErrorKind::kResource, std::string(what) + " for the RDMA listener: " + std::strerror(errno)};
  };
  channel_.reset(rdma_create_event_channel());
  if (!channel_) return fail("rdma_create_event_channel");
  if (!set_nonblocking(channel_->fd)) return fail("O_NONBLOCK");
  auto clients = listen_on(opt.listen_address, opt.port);
  if (!clients) return clients.error();
  listen_id_ = std::move(clients.value());
  if (opt.cluster.listen_rdma_port != 0) {
    auto routes = listen_on(opt.cluster.listen_rdma_address, opt.cluster.listen_rdma_port);
    if (!routes) return routes.error();
    route_listen_id_ = std::move(routes.value());
  }
  stop_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!stop_fd_) return fail("eventfd");
  for (const auto& dev : devices_.devices()) {
    if (!set_nonblocking(dev->context->async_fd)) return fail("O_NONBLOCK on a device async fd");
  }
  return {};
}

void Listener::start() {
  thread_ = std::thread([this] {
    name_this_thread("rb-accept");
    run();
  });
}

void Listener::stop() {
  if (stop_fd_) {
    std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(stop_fd_.get(), &one, sizeof one);
  }
  if (thread_.joinable()) thread_.join();
  route_listen_id_.reset();
  listen_id_.reset();
}

void Listener::run() {
  const auto& devices = devices_.devices();
  std::vector<pollfd> fds;
  fds.push_back({stop_fd_.get(), POLLIN, 0});
  fds.push_back({channel_->fd, POLLIN, 0});
  for (const auto& dev : devices) fds.push_back({dev->context->async_fd, POLLIN, 0});
  while (true) {
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("listener: poll: {}", std::strerror(errno));
      return;
    }
    if (fds[0].revents != 0) return;
    if (fds[1].revents != 0) {
      rdma_cm_event* ev = nullptr;
      while (rdma_get_cm_event(channel_.get(), &ev) == 0) {
        if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
          on_connect_request(ev);  // acks it
          continue;
        }
        verbs::CmEventPtr owned(ev);  // acked at the end of this scope
        switch (ev->event) {
          case RDMA_CM_EVENT_DEVICE_REMOVAL:
            spdlog::error("listener: the RDMA device under the listening address was removed");
            break;
          default:
            spdlog::debug("listener: CM event {}", rdma_event_str(ev->event));
            break;
        }
      }
    }
    for (std::size_t i = 0; i < devices.size(); ++i) {
      if (fds[2 + i].revents != 0) on_async_event(*devices[i]);
    }
  }
}

void Listener::reject(rdma_cm_id* id, proto::RejectReason reason, const std::string& peer) {
  core_.admission->refuse(Admission::Via::kRdma, peer, proto::to_string(reason), reason);
  reject_connect_request(id, reason, core_.options.buffer_size);
  rdma_destroy_id(id);
}

void Listener::on_connect_request(rdma_cm_event* ev) {
  rdma_cm_id* id = ev->id;  // a new id, ours to accept, reject or hand over
  const bool route_listener = route_listen_id_ && ev->listen_id == route_listen_id_.get();
  const std::string peer = peer_address(id);
  std::span<const std::byte> pdata(static_cast<const std::byte*>(ev->param.conn.private_data),
                                   ev->param.conn.private_data_len);
  proto::ConnectRequest req;
  const auto refuse = core_.admission->check(Admission::Via::kRdma, pdata, req);
  // Ack before anything else: the private data is copied, and rdma_migrate_id
  // waits until every event of the id is acked.
  rdma_ack_cm_event(ev);
  if (refuse) return reject(id, *refuse, peer);
  proto::RejectReason why{};
  std::optional<Admission::Eviction> evict;
  const std::uint64_t conn_id = core_.next_connection_id.fetch_add(1);
  Worker& worker = workers_.rdma_owner(conn_id);
  const auto slot = core_.admission->reserve(false, {conn_id, worker.index(), peer}, why, evict);
  if (evict) workers_.evict(*evict);
  if (!slot) return reject(id, why, peer);
  id->context = reinterpret_cast<void*>(static_cast<std::uintptr_t>(conn_id));
  if (rdma_migrate_id(id, worker.cm_channel()) != 0) {
    spdlog::error("connection {} from {}: rdma_migrate_id: {}", conn_id, peer, std::strerror(errno));
    core_.admission->release(*slot);
    return reject(id, proto::RejectReason::kNoResources, peer);
  }
  worker.post(AcceptCommand{verbs::CmIdPtr(id), req, conn_id, *slot, peer, route_listener});
}

void Listener::on_async_event(Device& dev) {
  ibv_async_event ev;
  while (ibv_get_async_event(dev.context, &ev) == 0) {
    switch (ev.event_type) {
      case IBV_EVENT_QP_FATAL:
      case IBV_EVENT_QP_REQ_ERR:
      case IBV_EVENT_QP_ACCESS_ERR: {
        // qp_context holds the connection id (set at QP creation); the QP
        // cannot be destroyed before this event is acked, so reading it is safe.
        const auto conn_id =
            static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(ev.element.qp->qp_context));
        workers_.rdma_owner(conn_id).post(
            QpFatalCommand{conn_id, std::string(ibv_event_type_str(ev.event_type)) + " on " + dev.name});
        break;
      }
      case IBV_EVENT_DEVICE_FATAL:
        spdlog::critical("device {}: fatal error event", dev.name);
        break;
      case IBV_EVENT_QP_LAST_WQE_REACHED: {
        // A QP on an SRQ went to the error state. Every close causes this
        // (rdma_disconnect); for a connection still open it is the only news
        // of a QP that failed while idle.
        const auto conn_id =
            static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(ev.element.qp->qp_context));
        workers_.rdma_owner(conn_id).post(QpFatalCommand{
            conn_id,
            std::string(ibv_event_type_str(ev.event_type)) + " on " + dev.name + " (the QP is in error)",
            true});
        break;
      }
      case IBV_EVENT_SRQ_LIMIT_REACHED: {
        // srq_context holds the index of the worker that owns the queue
        // (RdmaPort::create); the queue outlives the listener's event loop.
        const auto worker = reinterpret_cast<std::uintptr_t>(ev.element.srq->srq_context);
        if (worker < workers_.size())
          workers_[static_cast<std::uint32_t>(worker)].post(SrqLimitCommand{ev.element.srq});
        break;
      }
      default:
        spdlog::info("device {}: async event {}", dev.name, ibv_event_type_str(ev.event_type));
        break;
    }
    ibv_ack_async_event(&ev);
  }
}

}  // namespace rdmabroker::daemon
