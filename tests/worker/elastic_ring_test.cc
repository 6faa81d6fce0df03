// ElasticRing and the elastic AllreduceStore: each of the chief's lists of
// members is a ring of its own between real gRPC servers on 127.0.0.1 (one
// per worker, each driven by its own thread as worker processes would be);
// a newer list fails the op in progress at once; a message of another
// list's ring is not taken; and the stores that regroup carry on from the
// newest state one of them holds, bit for bit.
#include "worker/ring/elastic_ring.h"

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/rpc_util.h"
#include "common/status_macros.h"
#include "common/transport_security.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "tests/free_port.h"
#include "worker/store/allreduce_store.h"

namespace psrt {
namespace {

// Worker replicas 0..n-1, each an ElasticRing served on its own address.
struct Workers {
  explicit Workers(int n, absl::Duration timeout = absl::Seconds(30)) {
    for (int r = 0; r < n; ++r) addresses.push_back(absl::StrCat("127.0.0.1:", FreePort()));
    RingOptions options;
    options.timeout = timeout;
    options.startup_timeout = timeout;
    options.security = std::make_shared<const TransportSecurity>();
    for (int r = 0; r < n; ++r) {
      rings.push_back(std::make_unique<ElasticRing>(options, r));
      grpc::ServerBuilder builder;
      ConfigurePsServer(&builder, int64_t{1} << 30);
      builder.AddListeningPort(addresses[r], grpc::InsecureServerCredentials());
      builder.RegisterService(rings[r]->service());
      servers.push_back(builder.BuildAndStart());
      EXPECT_NE(servers.back(), nullptr);
    }
  }
  ~Workers() {
    for (auto& server : servers) server->Shutdown();
  }
  // List `generation` of `replicas`.
  ElasticRing::Members List(int64_t generation, const std::vector<int>& replicas) const {
    ElasticRing::Members members;
    members.generation = generation;
    members.replicas = replicas;
    for (int r : replicas) members.addresses.push_back(addresses[r]);
    return members;
  }
  // Tells `list` to the rings of `told`.
  void Tell(const ElasticRing::Members& list, const std::vector<int>& told) {
    for (int r : told) rings[r]->MembersChanged(list);
  }
  // Runs fn(r) for each of `who` on a thread of its own; each one's status.
  std::vector<absl::Status> Run(const std::vector<int>& who,
                                const std::function<absl::Status(int)>& fn) {
    std::vector<absl::Status> results(who.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < who.size(); ++i) {
      threads.emplace_back([&, i] { results[i] = fn(who[i]); });
    }
    for (auto& t : threads) t.join();
    return results;
  }
  std::vector<std::string> addresses;
  std::vector<std::unique_ptr<ElasticRing>> rings;
  std::vector<std::unique_ptr<grpc::Server>> servers;
};

// Each of `who` regroups, then sums {replica + 1, 10}; each one's sums.
std::vector<std::vector<float>> RegroupAndSum(Workers& workers, const std::vector<int>& who) {
  std::vector<std::vector<float>> sums(who.size());
  const std::vector<absl::Status> results = workers.Run(who, [&](int r) -> absl::Status {
    RETURN_IF_ERROR(workers.rings[r]->Regroup(absl::Seconds(10)));
    std::vector<float> values = {static_cast<float>(r + 1), 10};
    RETURN_IF_ERROR(workers.rings[r]->ring()->AllreduceSum(absl::MakeSpan(values)));
    sums[std::find(who.begin(), who.end(), r) - who.begin()] = values;
    return absl::OkStatus();
  });
  for (const absl::Status& status : results) EXPECT_TRUE(status.ok()) << status;
  return sums;
}

TEST(ElasticRingTest, EachListIsARingOfItsOwn) {
  Workers workers(3);
  EXPECT_TRUE(workers.rings[0]->stale()) << "no ring before the first list";
  workers.Tell(workers.List(1, {0, 2}), {0, 1, 2});
  for (const auto& sum : RegroupAndSum(workers, {0, 2})) {
    EXPECT_EQ(sum, (std::vector<float>{1 + 3, 20}));
  }
  EXPECT_EQ(workers.rings[2]->ring()->rank(), 1);
  EXPECT_EQ(workers.rings[2]->ring()->size(), 2);
  EXPECT_EQ(workers.rings[2]->generation(), 1);
  EXPECT_FALSE(workers.rings[0]->stale());
  // Worker 1 is in no list yet: it waits for one naming it.
  const absl::Status unlisted = workers.rings[1]->Regroup(absl::Milliseconds(200));
  EXPECT_TRUE(absl::IsDeadlineExceeded(unlisted)) << unlisted;
  // An older or the same list again changes nothing.
  workers.Tell(workers.List(1, {0, 1, 2}), {0});
  EXPECT_FALSE(workers.rings[0]->stale());

  workers.Tell(workers.List(2, {0, 1, 2}), {0, 1, 2});
  EXPECT_TRUE(workers.rings[0]->stale());
  std::vector<float> old_ring = {1};
  const absl::Status superseded = workers.rings[0]->ring()->AllreduceSum(absl::MakeSpan(old_ring));
  EXPECT_TRUE(absl::IsAborted(superseded)) << superseded;
  for (const auto& sum : RegroupAndSum(workers, {0, 1, 2})) {
    EXPECT_EQ(sum, (std::vector<float>{1 + 2 + 3, 30}));
  }
  EXPECT_EQ(workers.rings[1]->members().replicas, (std::vector<int>{0, 1, 2}));
}

// A member that died leaves the others waiting inside an op; the chief's
// next list (without it) ends that op at once, not after the ring's timeout.
TEST(ElasticRingTest, ANewerListEndsTheOpInProgressAtOnce) {
  Workers workers(2, /*timeout=*/absl::Seconds(120));
  workers.Tell(workers.List(1, {0, 1}), {0, 1});
  for (const auto& sum : RegroupAndSum(workers, {0, 1})) EXPECT_EQ(sum[1], 20);
  // Worker 1 takes no part in the next op: worker 0 waits for it.
  const absl::Time start = absl::Now();
  std::thread told([&] {
    absl::SleepFor(absl::Milliseconds(300));
    workers.Tell(workers.List(2, {0}), {0});
  });
  std::vector<float> values = {1, 2};
  const absl::Status ended = workers.rings[0]->ring()->AllreduceSum(absl::MakeSpan(values));
  told.join();
  EXPECT_TRUE(absl::IsAborted(ended)) << ended;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  // The list of worker 0 alone.
  for (const auto& sum : RegroupAndSum(workers, {0})) EXPECT_EQ(sum, (std::vector<float>{1, 10}));
}

// Worker 0 has moved on to list 2; worker 1, not yet told, still sends as
// list 1's ring: its op fails (its message refused, or ended by worker 0's
// of list 2's ring, whichever comes first), and once it has regrouped the
// two sum in list 2's ring.
TEST(ElasticRingTest, AMessageOfAnotherListsRingIsNotTaken) {
  Workers workers(2);
  workers.Tell(workers.List(1, {0, 1}), {0, 1});
  RegroupAndSum(workers, {0, 1});
  workers.Tell(workers.List(2, {0, 1}), {0});
  std::vector<absl::Status> results(2);
  std::vector<float> sum0 = {1}, sum1 = {2};
  std::thread zero([&] {
    results[0] = workers.rings[0]->Regroup(absl::Seconds(10));
    if (results[0].ok()) results[0] = workers.rings[0]->ring()->AllreduceSum(absl::MakeSpan(sum0));
  });
  std::vector<float> stale = {2};
  const absl::Status refused = workers.rings[1]->ring()->AllreduceSum(absl::MakeSpan(stale));
  EXPECT_TRUE(absl::IsFailedPrecondition(refused) || absl::IsAborted(refused)) << refused;
  EXPECT_NE(refused.message().find("list 2"), std::string::npos) << refused;
  workers.Tell(workers.List(2, {0, 1}), {1});
  results[1] = workers.rings[1]->Regroup(absl::Seconds(10));
  if (results[1].ok()) results[1] = workers.rings[1]->ring()->AllreduceSum(absl::MakeSpan(sum1));
  zero.join();
  for (const absl::Status& status : results) EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(sum0, std::vector<float>{3});
  EXPECT_EQ(sum1, std::vector<float>{3});
}

// The elastic AllreduceStore: the members that regroup carry on from the
// newest state one of them holds (here the chief's, a step ahead of the
// worker that was out of the ring), and then train on in step, bit for bit.
TEST(ElasticAllreduceStoreTest, RegroupedMembersCarryOnFromTheNewestState) {
  Workers workers(2);
  const std::vector<VariableDef> variables = {{"w", {3, 2}}, {"b", {2}}};
  std::vector<std::unique_ptr<AllreduceStore>> stores;
  for (int r = 0; r < 2; ++r) {
    AllreduceStore::Options options;
    options.elastic = workers.rings[r].get();
    options.membership_wait = absl::Milliseconds(100);
    options.regroup_timeout = absl::Seconds(20);
    stores.push_back(std::make_unique<AllreduceStore>(options, variables));
    EXPECT_TRUE(stores[r]->regroups());
  }
  proto::TrainingConfig config;
  config.set_mode(proto::SYNC);
  config.set_num_replicas(2);
  config.set_replicas_to_aggregate(2);
  config.set_max_workers(2);
  config.set_min_workers(1);
  config.set_optimizer(proto::MOMENTUM);
  config.set_momentum(0.9f);
  config.set_learning_rate(0.1f);
  // A fresh tensor of each variable's shape.
  auto tensors = [&] {
    std::vector<Tensor> t;
    for (const VariableDef& v : variables) t.emplace_back(v.shape);
    return t;
  };
  std::vector<Tensor> initial = tensors();
  for (Tensor& t : initial) {
    for (int64_t i = 0; i < t.num_elements(); ++i) t.data()[i] = 0.5f * static_cast<float>(i);
  }
  ASSERT_TRUE(stores[0]->WaitForServers(absl::Seconds(5)).ok());
  ASSERT_TRUE(stores[0]->Init(config, initial).ok());
  auto grads = [&](float scale) {
    std::vector<Tensor> g = tensors();
    for (Tensor& t : g) {
      for (int64_t i = 0; i < t.num_elements(); ++i) t.data()[i] = scale * (1 + i);
    }
    return g;
  };
  auto values = [&](int r, int64_t* version) {
    std::vector<Tensor> params = tensors();
    absl::StatusOr<ParameterStore::PullResult> pulled = stores[r]->Pull(0, &params);
    EXPECT_TRUE(pulled.ok()) << pulled.status();
    if (pulled.ok()) *version = pulled->version;
    std::vector<float> flat;
    for (const Tensor& t : params) flat.insert(flat.end(), t.data(), t.data() + t.num_elements());
    return flat;
  };

  // List 1: the chief alone, one step ahead of worker 1.
  workers.Tell(workers.List(1, {0}), {0, 1});
  ASSERT_TRUE(stores[0]->WaitForModelReady(absl::Seconds(5)).ok());
  ASSERT_TRUE(stores[0]->Push(grads(1)).ok());
  // List 2: both. Worker 1 gets the chief's state (and config) as it joins.
  workers.Tell(workers.List(2, {0, 1}), {0, 1});
  const absl::Status aborted = stores[0]->Push(grads(1)).status();
  EXPECT_TRUE(absl::IsAborted(aborted)) << aborted;
  std::vector<absl::Status> ready = workers.Run({0, 1}, [&](int r) -> absl::Status {
    return r == 0 ? stores[0]->Regroup() : stores[1]->WaitForModelReady(absl::Seconds(5)).status();
  });
  for (const absl::Status& status : ready) ASSERT_TRUE(status.ok()) << status;
  int64_t v0 = -1, v1 = -1;
  EXPECT_EQ(values(1, &v1), values(0, &v0));
  EXPECT_EQ(v0, 1);
  EXPECT_EQ(v1, 1);
  EXPECT_EQ(stores[1]->GetStatus()->at(0).config().optimizer(), proto::MOMENTUM);
  // Two steps together: the mean of both gradients, momentum included.
  for (int step = 0; step < 2; ++step) {
    std::vector<absl::Status> pushed = workers.Run({0, 1}, [&](int r) {
      return stores[r]->Push(grads(r == 0 ? 1.0f : 3.0f)).status();
    });
    for (const absl::Status& status : pushed) ASSERT_TRUE(status.ok()) << status;
  }
  EXPECT_EQ(values(1, &v1), values(0, &v0));
  EXPECT_EQ(v0, 3);
  EXPECT_EQ(v1, 3);
}

}  // namespace
}  // namespace psrt
