// SPDX-License-Identifier: Apache-2.0
// What other threads ask of a worker: one handler per command, in the order
// they were posted, at the top of each loop turn.
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>

#include "rdmabroker/config/config.hpp"
#include "worker/worker.hpp"

namespace rdmabroker::daemon {

void Worker::handle_commands() {
  commands_.drain(command_scratch_);
  for (auto& cmd : command_scratch_) std::visit([this](auto& c) { on_command(c); }, cmd);
  command_scratch_.clear();
}

void Worker::on_command(EvictCommand& cmd) {
  if (connections_.evict_unauthenticated(cmd.connection_id)) return;
  if (any_port([&](Port& p) { return p.evict_accepting(cmd.connection_id); })) return;
  if (evicted_before_accept_.size() >= 4096) evicted_before_accept_.clear();  // stale ids (see the member)
  evicted_before_accept_.insert(cmd.connection_id);
}

void Worker::on_command(AcceptCommand& cmd) {
  if (evicted_before_accept_.erase(cmd.connection_id) > 0) {
    ctx_.core.admission->refuse(
        Admission::Via::kRdma, cmd.peer,
        "evicted before it was accepted: the unauthenticated connections are at their limit",
        proto::RejectReason::kTooManyConnections);
    reject_connect_request(cmd.id.get(), proto::RejectReason::kTooManyConnections, ctx_.options.buffer_size);
    ctx_.core.admission->release(cmd.slot);
    return;
  }
  RdmaPort* port = nullptr;
  for (RdmaPort* p : rdma_ports_) {
    if (p->device.context == cmd.id->verbs) port = p;
  }
  if (port == nullptr) {
    spdlog::warn("connection {} from {} refused: unknown device", cmd.connection_id, cmd.peer);
    ctx_.stats.accept_failures.add();
    reject_connect_request(cmd.id.get(), proto::RejectReason::kNoResources, ctx_.options.buffer_size);
    ctx_.core.admission->release(cmd.slot);
    return;
  }
  if (auto conn = RdmaLink::accept(cmd, *port, ctx_, connections_, stopping_))
    connections_.add(std::move(conn));
}

void Worker::on_command(DeliverCommand& cmd) {
  ctx_.stats.handoffs_queued.add();
  deliver(cmd.items);
}

void Worker::deliver(std::vector<RemoteDelivery>& items) {
  std::int64_t arrived = 0;  // their charge, no longer in transit (WorkerStats::transit_charge_in)
  for (const auto& d : items) {
    if (d.in_transit_charge) arrived += queued_charge(d.item.body_len, d.item.messages);
  }
  ctx_.stats.transit_charge_in.add(static_cast<std::uint64_t>(arrived));
  for (auto& d : items) {
    Connection* c = connections_.find_up(d.connection);
    if (c == nullptr) {
      // Counted at what begins a message (an ABORT for a subscriber gone
      // meanwhile: its message was counted where its first fragment went).
      ctx_.stats.dropped[static_cast<std::size_t>(DropReason::kSubscriberClosed)].add(messages_begun(d.item));
      ctx_.core.slots->add_queued(d.slot, -static_cast<std::int64_t>(d.item.body_len));
      continue;
    }
    connections_.enqueue(*c, std::move(d.item));
  }
}

void Worker::on_command(QpFatalCommand& cmd) {
  Connection* c = connections_.find(cmd.connection_id);
  if (c != nullptr && (!cmd.only_if_open || c->is_up())) {
    spdlog::warn("connection {} ({}): {}", c->id, c->peer, cmd.event);
    connections_.close(*c, CloseReason::kQpFatal);
  }
}

void Worker::on_command(ReloadCommand& cmd) {
  // The settings config::diff() marks live, taken from the field table.
  config::copy_live(cmd.options, ctx_.options);
  if (cmd.auth) frames_.apply_auth(cmd.auth);
  if (cmd.applied) cmd.applied->set_value();
}

void Worker::on_command(InfoCommand& cmd) {
  connections_.for_each([&](Connection& c) {
    if (c.state == ConnState::kOpen) frames_.send_info(c, cmd.info);
  });
}

void Worker::on_command(InterestSyncedCommand& cmd) { frames_.release_pongs(cmd.through); }

void Worker::on_command(SrqLimitCommand& cmd) {
  for (RdmaPort* port : rdma_ports_) {
    if (port->srq() == cmd.srq) port->on_srq_limit();
  }
}

void Worker::on_command(ListConnectionsCommand& cmd) {
  std::vector<ConnectionInfo> out;
  connections_.for_each([&](Connection& c) {
    out.push_back(ConnectionInfo{
        c.id, std::string(c.link->protocol()), c.protocol_version, c.peer, std::string(to_string(c.state)),
        c.identity ? c.identity->name
        : c.dialed ? "route out"
                   : "",
        ctx_.index, c.subscriptions.size(), c.messages_in, c.messages_out, c.bytes_in, c.bytes_out,
        c.pending_messages, c.pending_bytes, c.link->receive_window(),
        c.identity && c.identity->route ? c.identity->route_server
        : c.dialed                      ? c.dialed->broker
                                        : std::string()});
  });
  cmd.reply->set_value(std::move(out));
}

void Worker::on_command(ShutdownCommand&) {
  stopping_ = true;
  for (auto& port : ports_) port->stop_accepting();  // the TCP port's route dials too
  // A route dial that completed now would make a connection nothing closes.
  if (dialer_) dialer_->cancel_all();
  waiting_dials_.clear();
  connections_.close_all_for_shutdown();
}

void Worker::on_command(FaultCommand& f) {
  Status result;
  Connection* c = connections_.find(f.spec.connection);
  if (c == nullptr) {
    result = Error{ErrorKind::kInvalidArgument,
                   "no connection " + std::to_string(f.spec.connection) + " on this broker"};
  } else if (c->transport() != Transport::kRdma) {
    result = Error{ErrorKind::kInvalidArgument,
                   "connection " + std::to_string(c->id) + " is not an RDMA connection"};
  } else if (!c->is_up()) {
    result = Error{ErrorKind::kInvalidArgument,
                   "connection " + std::to_string(c->id) + " is " + std::string(to_string(c->state))};
  } else if (f.spec.kind != fault::Kind::kWcError && f.spec.kind != fault::Kind::kQpError) {
    result = Error{ErrorKind::kInvalidArgument, "not a fault of a connection"};
  } else {
    result = c->link->inject_fault(f.spec.kind);
  }
  f.reply->set_value(std::move(result));
}

}  // namespace rdmabroker::daemon
