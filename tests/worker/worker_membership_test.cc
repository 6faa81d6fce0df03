// MembershipRegistry (the chief's list of an elastic job's workers) with a
// recording announcer, and MembershipClient against it over real gRPC.
#include "worker/worker_membership.h"

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/rpc_util.h"
#include "common/transport_security.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "worker/ring/ring_options.h"

namespace psrt {
namespace {

// Records every list announced; answers with version `version`.
struct Announcements {
  absl::Mutex mu;
  std::vector<proto::MembersRequest> lists;
  int64_t version = 7;

  MembershipRegistry::Announce Announcer() {
    return [this](const proto::MembersRequest& request) -> absl::StatusOr<int64_t> {
      absl::MutexLock lock(&mu);
      lists.push_back(request);
      return version;
    };
  }
  int count() {
    absl::MutexLock lock(&mu);
    return static_cast<int>(lists.size());
  }
  proto::MembersRequest LastList() {
    absl::MutexLock lock(&mu);
    return lists.empty() ? proto::MembersRequest() : lists.back();
  }
  // The last list as (replica, from_version) pairs.
  std::vector<std::pair<int, int64_t>> Last() {
    absl::MutexLock lock(&mu);
    std::vector<std::pair<int, int64_t>> members;
    if (lists.empty()) return members;
    for (int i = 0; i < lists.back().replicas_size(); ++i) {
      members.emplace_back(lists.back().replicas(i), lists.back().from_versions(i));
    }
    return members;
  }
};

proto::AttendRequest Call(int replica, bool leaving = false) {
  proto::AttendRequest request;
  request.set_replica(replica);
  request.set_worker_incarnation(100 + replica);
  request.set_leaving(leaving);
  return request;
}

MembershipRegistry::Options RegistryOptions(int min_workers, int max_workers,
                                            absl::Duration lease = absl::Seconds(60)) {
  MembershipRegistry::Options options;
  options.min_workers = min_workers;
  options.max_workers = max_workers;
  options.lease = lease;
  options.min_workers_timeout = absl::Seconds(30);
  return options;
}

using Members = std::vector<std::pair<int, int64_t>>;

// `registry`'s Membership service on a free port of 127.0.0.1 (*port).
std::unique_ptr<grpc::Server> Serve(MembershipRegistry* registry, int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), port);
  builder.RegisterService(registry->service());
  return builder.BuildAndStart();
}

// Training is never ended by an operator.
const std::function<bool()> kNever = [] { return false; };

TEST(MembershipRegistryTest, AWorkerIsAdmittedAtTheChiefsNextStep) {
  Announcements announced;
  MembershipRegistry registry(RegistryOptions(1, 3), announced.Announcer());
  // The first step sends the chief's list (a restarted chief's shards may
  // still wait for workers it never heard from); then only changes go out.
  EXPECT_TRUE(registry.AtStep(0, kNever).ok());
  EXPECT_EQ(announced.Last(), (Members{{0, 0}}));
  EXPECT_TRUE(registry.AtStep(1, kNever).ok());
  EXPECT_EQ(announced.count(), 1);
  auto first = registry.Attend(Call(2));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->member());
  ASSERT_TRUE(registry.AtStep(12, kNever).ok());
  // From the version after the chief's next push: it cannot push that one
  // before the list reaches the shards.
  EXPECT_EQ(announced.Last(), (Members{{0, 0}, {2, 13}}));
  auto admitted = registry.Attend(Call(2));
  ASSERT_TRUE(admitted.ok());
  EXPECT_TRUE(admitted->member());
  EXPECT_EQ(admitted->from_version(), 13);
  EXPECT_EQ(registry.members(), 2);
  // After a recovery (to version 20) the list goes out again, every
  // member counted from the next version (the restored shards dropped
  // their pushes of 20).
  registry.Recovered();
  ASSERT_TRUE(registry.AtStep(20, kNever).ok());
  EXPECT_EQ(announced.count(), 3);
  EXPECT_EQ(announced.Last(), (Members{{0, 0}, {2, 21}}));
}

TEST(MembershipRegistryTest, AWorkerLearnsItIsAMemberOnlyOnceTheListWentOut) {
  // While the list is on its way the joiner is told to wait; a list that a
  // shard did not take admits it again, from a later version, next time.
  MembershipRegistry* registry_ptr = nullptr;
  std::vector<bool> member_while_announcing;
  int calls = 0;
  Announcements announced;
  MembershipRegistry registry(
      RegistryOptions(1, 3), [&](const proto::MembersRequest& request) -> absl::StatusOr<int64_t> {
        member_while_announcing.push_back(registry_ptr->Attend(Call(1))->member());
        if (++calls == 1) return absl::UnavailableError("one shard is down");
        return announced.Announcer()(request);
      });
  registry_ptr = &registry;
  ASSERT_TRUE(registry.Attend(Call(1)).ok());
  // A shard that does not take the list does not stop the step (the
  // chief's push finds the fault) ...
  EXPECT_TRUE(registry.AtStep(4, kNever).ok());
  EXPECT_FALSE(registry.Attend(Call(1))->member());
  // ... and the worker is admitted again at the next step.
  EXPECT_TRUE(registry.AtStep(5, kNever).ok());
  EXPECT_EQ(announced.Last(), (Members{{0, 0}, {1, 6}}));
  EXPECT_EQ(member_while_announcing, (std::vector<bool>{false, false}));
  auto admitted = registry.Attend(Call(1));
  EXPECT_TRUE(admitted->member());
  EXPECT_EQ(admitted->from_version(), 6);
}

TEST(MembershipRegistryTest, ReplicasOutsideMaxWorkersAreRefused) {
  Announcements announced;
  MembershipRegistry registry(RegistryOptions(1, 3), announced.Announcer());
  for (int replica : {0, 3, -1}) {
    const absl::Status refused = registry.Attend(Call(replica)).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << replica;
    EXPECT_NE(refused.message().find("--max_workers=3"), absl::string_view::npos);
  }
}

TEST(MembershipRegistryTest, AStepWaitsForMinWorkers) {
  Announcements announced;
  MembershipRegistry registry(RegistryOptions(3, 4), announced.Announcer());
  ASSERT_TRUE(registry.Attend(Call(1)).ok());
  absl::Notification stepped;
  std::thread chief([&] {
    EXPECT_TRUE(registry.AtStep(0, kNever).ok());
    stepped.Notify();
  });
  EXPECT_FALSE(stepped.WaitForNotificationWithTimeout(absl::Milliseconds(300)));
  ASSERT_TRUE(registry.Attend(Call(3)).ok());
  EXPECT_TRUE(stepped.WaitForNotificationWithTimeout(absl::Seconds(10)));
  chief.join();
  EXPECT_EQ(announced.Last(), (Members{{0, 0}, {1, 1}, {3, 1}}));
}

TEST(MembershipRegistryTest, AStepStopsWaitingOnceTrainingIsOver) {
  Announcements announced;
  MembershipRegistry registry(RegistryOptions(2, 3), announced.Announcer());
  std::atomic<bool> over{false};
  absl::Notification stepped;
  std::thread chief([&] {
    EXPECT_TRUE(registry.AtStep(30, [&] { return over.load(); }).ok());
    stepped.Notify();
  });
  EXPECT_FALSE(stepped.WaitForNotificationWithTimeout(absl::Milliseconds(300)));
  over = true;  // psrtctl shutdown: the chief's push then ends its loop.
  EXPECT_TRUE(stepped.WaitForNotificationWithTimeout(absl::Seconds(10)));
  chief.join();
}

TEST(MembershipRegistryTest, SilentAndLeavingWorkersAreDroppedAtOnce) {
  Announcements announced;
  MembershipRegistry registry(RegistryOptions(1, 4, absl::Milliseconds(400)),
                              announced.Announcer());
  ASSERT_TRUE(registry.Attend(Call(1)).ok());
  ASSERT_TRUE(registry.Attend(Call(2)).ok());
  ASSERT_TRUE(registry.AtStep(5, kNever).ok());
  EXPECT_EQ(announced.Last(), (Members{{0, 0}, {1, 6}, {2, 6}}));
  // Replica 1 keeps calling, 2 goes silent: 2 is dropped after its lease,
  // without waiting for the chief's step.
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (announced.Last() != Members{{0, 0}, {1, 6}} && absl::Now() < until) {
    ASSERT_TRUE(registry.Attend(Call(1)).ok());
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(announced.Last(), (Members{{0, 0}, {1, 6}}));
  ASSERT_TRUE(registry.Attend(Call(1, /*leaving=*/true)).ok());
  const absl::Time gone = absl::Now() + absl::Seconds(10);
  while (announced.Last() != Members{{0, 0}} && absl::Now() < gone) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(announced.Last(), (Members{{0, 0}}));
  EXPECT_EQ(registry.members(), 1);
}

TEST(MembershipRegistryTest, AFailedDepartureIsSentAgainAQuarterLeaseLater) {
  // The shards unreachable (a ps restarting): the list without the worker
  // that left is tried again and again, each a quarter lease apart, not in
  // a tight loop; once a shard takes it, it stops.
  std::atomic<int> calls{0};
  std::atomic<bool> reachable{true};
  MembershipRegistry registry(
      RegistryOptions(1, 3, absl::Milliseconds(400)),
      [&](const proto::MembersRequest&) -> absl::StatusOr<int64_t> {
        ++calls;
        if (!reachable) return absl::UnavailableError("connection refused");
        return 7;
      });
  ASSERT_TRUE(registry.Attend(Call(1)).ok());
  ASSERT_TRUE(registry.AtStep(0, kNever).ok());
  reachable = false;
  const int before = calls.load();
  ASSERT_TRUE(registry.Attend(Call(1, /*leaving=*/true)).ok());
  absl::SleepFor(absl::Seconds(1));
  const int failed_tries = calls.load() - before;
  EXPECT_GE(failed_tries, 2);
  EXPECT_LE(failed_tries, 30);  // About 10 (every 100 ms); a tight loop makes thousands.
  reachable = true;
  absl::SleepFor(absl::Milliseconds(500));
  const int settled = calls.load();
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_EQ(calls.load(), settled);
}

TEST(MembershipClientTest, JoinsOverGrpcAndLeaves) {
  Announcements announced;
  MembershipRegistry registry(RegistryOptions(1, 2), announced.Announcer());
  int port = 0;
  std::unique_ptr<grpc::Server> server = Serve(&registry, &port);
  ASSERT_GT(port, 0);
  const TransportSecurity insecure;
  MembershipClient client(NewChannel(absl::StrCat("127.0.0.1:", port), insecure), 1,
                          absl::Seconds(2), absl::Seconds(20));
  // The chief admits it at its step, while the client waits.
  std::thread chief([&] {
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (registry.members() < 2 && absl::Now() < until) {
      EXPECT_TRUE(registry.AtStep(3, kNever).ok());
      absl::SleepFor(absl::Milliseconds(20));
    }
  });
  absl::StatusOr<int64_t> joined = client.Join();
  chief.join();
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(*joined, 4);
  client.Leave();
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (registry.members() > 1 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(registry.members(), 1);
  // A replica above --max_workers is told so at Join.
  MembershipClient extra(NewChannel(absl::StrCat("127.0.0.1:", port), insecure), 2,
                         absl::Seconds(2), absl::Seconds(20));
  const absl::Status refused = extra.Join().status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  server->Shutdown();
}

// Allreduce mode: every list is numbered and names where each member
// serves the ring; the chief's Join makes the first (itself alone), and a
// worker hears each newer list in the answers to its calls.
TEST(MembershipClientTest, RingListsReachTheWorkersWithTheirAddresses) {
  Announcements announced;
  MembershipRegistry::Options options = RegistryOptions(1, 3);
  options.ring = true;
  options.ring_address = "chief:1";
  MembershipRegistry registry(options, announced.Announcer());
  ASSERT_TRUE(registry.Join().ok());
  ASSERT_EQ(announced.count(), 1);
  // Numbered from this chief's start time (a restarted chief's are newer).
  EXPECT_EQ(ListNumber(announced.LastList().generation()), 1);
  EXPECT_GT(announced.LastList().generation() >> kListBits, int64_t{1} << 40);
  EXPECT_EQ(announced.LastList().ring_addresses(0), "chief:1");

  int port = 0;
  std::unique_ptr<grpc::Server> server = Serve(&registry, &port);
  ASSERT_GT(port, 0);
  absl::Mutex mu;
  std::vector<proto::MembersRequest> heard;
  const TransportSecurity insecure;
  MembershipClient client(NewChannel(absl::StrCat("127.0.0.1:", port), insecure), 2,
                          absl::Seconds(1), absl::Seconds(20), "two:2",
                          [&](const proto::MembersRequest& list) {
                            absl::MutexLock lock(&mu);
                            heard.push_back(list);
                          });
  std::thread chief([&] {
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (registry.members() < 2 && absl::Now() < until) {
      EXPECT_TRUE(registry.AtStep(3, kNever).ok());
      absl::SleepFor(absl::Milliseconds(20));
    }
  });
  const absl::Status joined = client.Join().status();
  chief.join();
  ASSERT_TRUE(joined.ok()) << joined;
  {
    absl::MutexLock lock(&mu);
    ASSERT_FALSE(heard.empty());
    const proto::MembersRequest& list = heard.back();
    EXPECT_EQ(ListNumber(list.generation()), 2);
    ASSERT_EQ(list.replicas_size(), 2);
    EXPECT_EQ(list.replicas(1), 2);
    EXPECT_EQ(list.ring_addresses(0), "chief:1");
    EXPECT_EQ(list.ring_addresses(1), "two:2");
    // Each list heard once, newest last.
    for (size_t i = 1; i < heard.size(); ++i) {
      EXPECT_GT(heard[i].generation(), heard[i - 1].generation());
    }
  }
  EXPECT_EQ(ListNumber(announced.LastList().generation()), 2);
  client.Leave();
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (announced.count() < 3 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(20));
  ASSERT_EQ(announced.count(), 3);
  EXPECT_EQ(ListNumber(announced.LastList().generation()), 3);
  EXPECT_EQ(announced.LastList().replicas_size(), 1);
  server->Shutdown();
}

}  // namespace
}  // namespace psrt
