// SPDX-License-Identifier: Apache-2.0
// The declaration of the multicast engine's statistics (see broker/stats.hpp).
// A broker without multicast declares them too, at 0, so that every series
// exists whatever the configuration.
#include "multicast/engine.hpp"

namespace rdmabroker::daemon {

void MulticastStats::visit(StatsVisitor& v) const {
  v.level("multicast.channels", channels.get(), "rdmabroker_multicast_channels",
          "Subjects served by a multicast channel (sequenced, repairable).");
  v.level("multicast.groups", groups.get(), "rdmabroker_multicast_groups",
          "Channels sending to a multicast group.");
  v.level("multicast.members", members.get(), "rdmabroker_multicast_members",
          "Subscriptions served by multicast channels.");
  v.level("multicast.members_joined", members_joined.get(), "rdmabroker_multicast_members_joined",
          "Channel subscriptions receiving from their group.");
  v.count("multicast.messages", messages, "rdmabroker_multicast_messages_total",
          "Messages sequenced by multicast channels.");
  v.count("multicast.group_messages", group_messages, "rdmabroker_multicast_group_messages_total",
          "Channel messages sent to a multicast group.");
  v.count("multicast.datagrams", datagrams, "rdmabroker_multicast_datagrams_total",
          "UD datagrams sent to multicast groups (fragments and heartbeats).");
  v.count("multicast.unicast_copies", unicast_copies, "rdmabroker_multicast_unicast_copies_total",
          "Channel messages sent over RC to members not in the group.");
  v.count("multicast.repairs_requested", repairs_requested, "rdmabroker_multicast_repairs_requested_total",
          "Multicast messages clients asked to have resent.");
  v.count("multicast.repairs_served", repairs_served, "rdmabroker_multicast_repairs_served_total",
          "Multicast messages resent over RC from the retransmit window.");
  v.count("multicast.losses", losses, "rdmabroker_multicast_unrecoverable_losses_total",
          "Multicast messages beyond the retransmit window, reported lost to the client.");
  v.count("multicast.joins", joins, "rdmabroker_multicast_joins_total",
          "Multicast groups joined by the broker (per device).");
  v.count("multicast.join_failures", join_failures, "rdmabroker_multicast_join_failures_total",
          "Group joins by the broker that failed (the subject stays unicast).");
  v.count("multicast.client_join_failures", client_join_failures,
          "rdmabroker_multicast_client_join_failures_total",
          "Subscriptions whose client could not join (served over RC).");
  v.count("multicast.send_errors", send_errors, "rdmabroker_multicast_send_errors_total",
          "Multicast UD sends that failed.");
  v.count("multicast.no_channel", no_channel);
}

}  // namespace rdmabroker::daemon
