// A client's /metrics text (cleave-client --metrics-listen).
#include <gtest/gtest.h>

#include "client/client.h"

namespace cleave {
namespace {

TEST(ClientMetricsTest, EveryFigureIsASampleWithItsHelpAndType) {
  ClientState s;
  s.connected = true;
  s.run_id = "run \"7\"\\x";
  s.client_id = "c3";
  s.round = 12;
  s.tasks_done = 11;
  s.tasks_failed = 1;
  s.bytes_sent = 123456789012;
  s.bytes_received = 42;
  s.train_seconds = 0.25;
  s.train_loss = 1.5;
  s.examples = 6000;
  s.gossip_uplink_mbps = 16.5;
  const std::string text = ClientMetricsText(s);
  for (const char* line : {
           "cleave_device_info{run_id=\"run \\\"7\\\"\\\\x\",client_id=\"c3\"} 1\n",
           "cleave_device_connected 1\n",
           "cleave_device_round 12\n",
           "cleave_device_tasks_done_total 11\n",
           "cleave_device_tasks_failed_total 1\n",
           "cleave_device_bytes_sent_total 123456789012\n",
           "cleave_device_bytes_received_total 42\n",
           "cleave_device_train_seconds 0.25\n",
           "cleave_device_train_loss 1.5\n",
           "cleave_device_examples 6000\n",
           "cleave_device_gossip_uplink_mbps 16.5\n",
           "# TYPE cleave_device_bytes_sent_total counter\n",
           "# TYPE cleave_device_round gauge\n",
       }) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "\nin:\n" << text;
  }
  // Every line is a comment or a sample: 11 metrics, three lines each.
  int lines = 0;
  for (char c : text) lines += c == '\n';
  EXPECT_EQ(lines, 33);
  s.connected = false;
  EXPECT_NE(ClientMetricsText(s).find("cleave_device_connected 0\n"), std::string::npos);
}

}  // namespace
}  // namespace cleave
