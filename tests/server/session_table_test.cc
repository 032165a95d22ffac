// The coordinator's session table: who may join, the ids they get, who a call says it
// is, revocation, and the order sampling draws from.
#include "server/session_table.h"

#include <gtest/gtest.h>

namespace cleave {
namespace {

Session Ready(const std::string& token) {
  Session s;
  s.token = token;
  s.ready = true;
  return s;
}

TEST(SessionTableTest, GivesIdsInJoinOrderAndNamesFromTheJoinOrTheCertificate) {
  SessionTable plain(/*mutual=*/false);
  plain.set_max(10);
  EXPECT_EQ(plain.Add(Ready("t1"), "ignored-cn", "sim-1").id, "c1");
  const Session& second = plain.Add(Ready("t2"), "", "");
  EXPECT_EQ(second.id, "c2");
  EXPECT_EQ(second.name, "c2");  // no name given: its id
  EXPECT_EQ(plain.Find("c1")->name, "sim-1");
  EXPECT_EQ(plain.Find("c1")->identity, "");  // without mutual TLS no identity is kept
  SessionTable mutual(/*mutual=*/true);
  mutual.set_max(10);
  const Session& device = mutual.Add(Ready("t"), "edge-7", "whatever it says");
  EXPECT_EQ(device.identity, "edge-7");
  EXPECT_EQ(device.name, "edge-7");
}

TEST(SessionTableTest, RefusesJoinsPastTheLimitButForAReconnectingCertificate) {
  SessionTable t(/*mutual=*/true);
  t.set_max(1);
  ASSERT_TRUE(t.Admit("a").ok());
  t.Add(Ready("x"), "a", "");
  const Status full = t.Admit("b");
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("maximum of 1 sessions"), std::string::npos) << full;
  EXPECT_TRUE(t.Admit("a").ok());  // it replaces its own session
  EXPECT_EQ(t.ReplacedBy("a"), "c1");
  EXPECT_EQ(t.ReplacedBy("b"), "");
  SessionTable plain(/*mutual=*/false);
  plain.set_max(1);
  plain.Add(Ready("x"), "", "a");
  EXPECT_EQ(plain.Admit("").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(plain.ReplacedBy(""), "");  // without certificates nothing is replaced
}

TEST(SessionTableTest, AuthenticatesTheTokenAndTheCertificate) {
  SessionTable t(/*mutual=*/true);
  t.set_max(4);
  t.Add(Ready("secret"), "dev", "");
  const auto ok = t.Authenticate("c1", "secret", "dev");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)->id, "c1");
  EXPECT_EQ(t.Authenticate("c1", "secreT", "dev").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(t.Authenticate("c9", "secret", "dev").status().code(),
            absl::StatusCode::kUnauthenticated);
  const auto other = t.Authenticate("c1", "secret", "other-dev");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(other.status().message().find("joined as 'dev'"), std::string::npos) << other.status();
}

TEST(SessionTableTest, RevokingACertificateNamesItsSessionsAndRefusesIt) {
  SessionTable t(/*mutual=*/true);
  t.set_max(4);
  t.Add(Ready("1"), "a", "");
  t.Add(Ready("2"), "b", "");
  EXPECT_EQ(t.Revoke({"b", "z"}), std::vector<std::string>{"c2"});
  EXPECT_TRUE(t.Revoked("b"));
  EXPECT_EQ(t.Admit("b").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(t.Authenticate("c2", "2", "b").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(t.Revoke({}).empty());
  EXPECT_TRUE(t.Admit("b").ok());  // off the list again
}

TEST(SessionTableTest, SamplingOrderIsByNameNumericallyThenByIdAndSkipsUnavailableSessions) {
  SessionTable t(/*mutual=*/false);
  t.set_max(10);
  t.Add(Ready("t"), "", "sim-10");  // c1
  t.Add(Ready("t"), "", "sim-2");   // c2
  t.Add(Ready("t"), "", "sim-2");   // c3: a second of one name
  Session waiting = Ready("t");
  waiting.ready = false;
  t.Add(std::move(waiting), "", "sim-1");  // c4: no Welcome yet
  Session unfit = Ready("t");
  unfit.unfit = "needs 9 GiB";
  t.Add(std::move(unfit), "", "sim-3");  // c5: refused a task for memory
  t.Add(Ready("t"), "", "sim-4");        // c6: the driver does not serve it
  const auto serves = [](const std::string& id) { return id != "c6"; };
  EXPECT_EQ(t.Available(serves), (std::vector<std::string>{"c2", "c3", "c1"}));
  EXPECT_EQ(t.Ready(), 5);
  t.Remove("c3");
  EXPECT_EQ(t.Available(serves), (std::vector<std::string>{"c2", "c1"}));
  EXPECT_EQ(t.Ids(), (std::vector<std::string>{"c1", "c2", "c4", "c5", "c6"}));
}

}  // namespace
}  // namespace cleave
