#include "common/cluster_spec.h"

#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace psrt {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr char kSource[] = "cluster spec file /tmp/c.json";

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// Parses `json`, expects InvalidArgument, returns the message.
std::string ParseError(const std::string& json,
                       const std::string& source = kSource) {
  absl::StatusOr<ClusterSpec> spec = ClusterSpec::Parse(json, source);
  EXPECT_FALSE(spec.ok()) << json;
  if (spec.ok()) return "";
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument)
      << spec.status();
  const std::string message(spec.status().message());
  EXPECT_THAT(message, StartsWith(source + ": ")) << json;
  return message;
}

TEST(ClusterSpecTest, PlainShape) {
  auto spec = ClusterSpec::Parse(
      R"({"ps": ["10.0.0.1:2222", "10.0.0.2:2222"],
          "worker": ["10.0.0.3:2222", "localhost:2223"]})",
      kSource);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->num_ps(), 2);
  EXPECT_EQ(spec->num_tasks("worker"), 2);
  EXPECT_EQ(spec->num_tasks("chief"), 0);
  EXPECT_EQ(spec->num_tasks("evaluator"), 0);
  EXPECT_EQ(spec->address("ps", 1), "10.0.0.2:2222");
  EXPECT_EQ(spec->address("worker", 1), "localhost:2223");
  EXPECT_FALSE(spec->task().has_value());
  EXPECT_EQ(spec->num_replicas(), 2);
  EXPECT_EQ(spec->ReplicaIndex({"worker", 0}), 0);
  EXPECT_EQ(spec->ReplicaIndex({"worker", 1}), 1);
  EXPECT_EQ(spec->ReplicaAddress(1), "localhost:2223");
  EXPECT_THAT(spec->jobs().at("ps"),
              ElementsAre("10.0.0.1:2222", "10.0.0.2:2222"));
}

TEST(ClusterSpecTest, TfConfigShapeWithChiefAndEvaluator) {
  auto spec = ClusterSpec::Parse(
      R"({"cluster": {"chief": ["host0:2222"],
                      "worker": ["host1:2222", "host2:2222"],
                      "ps": ["host3:2222"],
                      "evaluator": ["host4:2222"]},
          "task": {"type": "worker", "index": 1},
          "environment": "cloud"})",
      "TF_CONFIG");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(spec->task().has_value());
  EXPECT_EQ(spec->task()->job, "worker");
  EXPECT_EQ(spec->task()->index, 1);
  EXPECT_EQ(spec->task()->ToString(), "worker/1");
  EXPECT_EQ(spec->num_replicas(), 3);
  EXPECT_EQ(spec->ReplicaIndex({"chief", 0}), 0);
  EXPECT_EQ(spec->ReplicaIndex({"worker", 0}), 1);
  EXPECT_EQ(spec->ReplicaIndex({"worker", 1}), 2);
  EXPECT_EQ(spec->ReplicaAddress(0), "host0:2222");
  EXPECT_EQ(spec->ReplicaAddress(2), "host2:2222");
  EXPECT_EQ(spec->num_tasks("evaluator"), 1);
}

TEST(ClusterSpecTest, ChiefWithoutWorkers) {
  auto spec = ClusterSpec::Parse(
      R"({"ps": ["a:1"], "chief": ["b:1"]})", kSource);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->num_replicas(), 1);
  EXPECT_EQ(spec->ReplicaAddress(0), "b:1");
}

TEST(ClusterSpecTest, TfConfigShapeWithoutTask) {
  auto spec = ClusterSpec::Parse(
      R"({"cluster": {"ps": ["a:1"], "worker": ["b:1"]}})", kSource);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->task().has_value());
}

TEST(ClusterSpecTest, Ipv6AndLocalhost) {
  auto spec = ClusterSpec::Parse(
      R"({"ps": ["[::1]:2222", "[fe80::1%eth0]:2222"],
          "worker": ["localhost:65535", "127.0.0.1:1"]})",
      kSource);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->address("ps", 0), "[::1]:2222");
}

TEST(ClusterSpecTest, FromFile) {
  const std::string path = WriteFile(
      "good_spec.json", R"({"ps": ["a:1"], "worker": ["b:1", "c:1"]})");
  auto spec = ClusterSpec::FromFile(path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->num_tasks("worker"), 2);
}

TEST(ClusterSpecTest, FromFileMissing) {
  const std::string path = testing::TempDir() + "/no_such_spec.json";
  auto spec = ClusterSpec::FromFile(path);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(spec.status().message()),
              StartsWith("cluster spec file " + path + ": "));
}

TEST(ClusterSpecTest, FromFileErrorsNameThePath) {
  const std::string path = WriteFile("bad_spec.json", R"({"ps": []})");
  auto spec = ClusterSpec::FromFile(path);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()),
              AllOf(StartsWith("cluster spec file " + path + ": "),
                    HasSubstr("job \"ps\" is empty")));
}

// ---- Malformed specs: one test per case. ----

// Protobuf's JSON parser accepts "[a, b,]"; JSON does not, nor do the
// other tools that read the spec (Python's json, jq).
TEST(ClusterSpecTest, ATrailingCommaIsRefusedNamingItsLine) {
  EXPECT_THAT(ParseError("{\"ps\": [\"a:1\"],\n \"worker\": [\"b:2\",\n]}"),
              HasSubstr("invalid JSON: a comma ends a list or an object on line 2"));
  EXPECT_THAT(ParseError(R"({"ps": ["a:1"], "worker": ["b:2"],})"),
              HasSubstr("a comma ends a list or an object on line 1"));
  // Inside a string it is the string's (here a bad address).
  EXPECT_THAT(ParseError(R"({"ps": ["a,]:1"], "worker": ["b:2"]})"),
              Not(HasSubstr("a comma ends")));
}

TEST(ClusterSpecTest, BadJson) {
  EXPECT_THAT(ParseError(R"({"ps": ["a:1"],)"), HasSubstr("invalid JSON: "));
  EXPECT_THAT(ParseError(R"({"ps": NaN})"),
              AllOf(HasSubstr("invalid JSON: "), HasSubstr("Unexpected token")));
  EXPECT_THAT(ParseError(""), HasSubstr("invalid JSON"));
  EXPECT_THAT(ParseError(R"({"ps": ["a:1"]} trailing)"),
              HasSubstr("invalid JSON"));
}

TEST(ClusterSpecTest, DuplicateJsonKey) {
  EXPECT_THAT(ParseError(R"({"ps": ["a:1"], "ps": ["b:1"], "worker": ["c:1"]})"),
              AllOf(HasSubstr("invalid JSON"), HasSubstr("ps")));
}

TEST(ClusterSpecTest, TopLevelNotAnObject) {
  EXPECT_THAT(ParseError(R"(["a:1"])"),
              HasSubstr("top level must be a JSON object, got a list"));
  EXPECT_THAT(ParseError("3"), HasSubstr("top level must be a JSON object"));
}

TEST(ClusterSpecTest, JobNotAList) {
  EXPECT_THAT(ParseError(R"({"ps": "a:1", "worker": ["b:1"]})"),
              AllOf(HasSubstr("job \"ps\" must be a list"),
                    HasSubstr("the string \"a:1\"")));
}

TEST(ClusterSpecTest, JobInDictFormIsRefused) {
  EXPECT_THAT(ParseError(R"({"ps": {"0": "a:1"}, "worker": ["b:1"]})"),
              AllOf(HasSubstr("job \"ps\" is an object"),
                    HasSubstr("list of \"host:port\" strings")));
}

TEST(ClusterSpecTest, TaskAddressNotAString) {
  EXPECT_THAT(ParseError(R"({"ps": ["a:1"], "worker": ["b:1", 7]})"),
              AllOf(HasSubstr("job \"worker\" task 1"),
                    HasSubstr("got the number 7")));
}

TEST(ClusterSpecTest, EmptyJob) {
  EXPECT_THAT(ParseError(R"({"ps": ["a:1"], "worker": []})"),
              HasSubstr("job \"worker\" is empty"));
}

TEST(ClusterSpecTest, UnknownJob) {
  EXPECT_THAT(ParseError(R"({"ps": ["a:1"], "workers": ["b:1"]})"),
              AllOf(HasSubstr("unknown job \"workers\""),
                    HasSubstr("chief, evaluator, ps, worker")));
}

TEST(ClusterSpecTest, WithoutPsIsAnAllreduceJob) {
  absl::StatusOr<ClusterSpec> spec = ClusterSpec::Parse(R"({"worker": ["b:1", "c:2"]})", "test");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->num_ps(), 0);
  EXPECT_EQ(spec->num_replicas(), 2);
  EXPECT_EQ(spec->ReplicaAddress(1), "c:2");
}

TEST(ClusterSpecTest, MissingWorkerAndChief) {
  EXPECT_THAT(ParseError(R"({"ps": ["a:1"], "evaluator": ["b:1"]})"),
              AllOf(HasSubstr("\"worker\""), HasSubstr("\"chief\"")));
}

TEST(ClusterSpecTest, TwoChiefs) {
  EXPECT_THAT(ParseError(R"({"ps": ["a:1"], "chief": ["b:1", "c:1"]})"),
              AllOf(HasSubstr("job \"chief\" has 2 tasks"),
                    HasSubstr("at most one")));
}

TEST(ClusterSpecTest, PortOutOfRange) {
  EXPECT_EQ(ParseError(R"({"ps": ["a:1", "x:99999"], "worker": ["b:1"]})"),
            std::string(kSource) +
                ": job \"ps\" task 1: bad address \"x:99999\": port must be "
                "in 1..65535");
  EXPECT_THAT(ParseError(R"({"ps": ["x:0"], "worker": ["b:1"]})"),
              AllOf(HasSubstr("\"x:0\""), HasSubstr("1..65535")));
}

TEST(ClusterSpecTest, MissingPort) {
  EXPECT_THAT(ParseError(R"({"ps": ["hostonly"], "worker": ["b:1"]})"),
              AllOf(HasSubstr("job \"ps\" task 0"),
                    HasSubstr("bad address \"hostonly\": missing port")));
  EXPECT_THAT(ParseError(R"({"ps": ["host:"], "worker": ["b:1"]})"),
              HasSubstr("bad address \"host:\": missing port"));
}

TEST(ClusterSpecTest, NonNumericPort) {
  EXPECT_THAT(ParseError(R"({"ps": ["a:1"], "worker": ["b:http"]})"),
              AllOf(HasSubstr("job \"worker\" task 0"),
                    HasSubstr("port \"http\" is not a number")));
  EXPECT_THAT(ParseError(R"({"ps": ["a:+80"], "worker": ["b:1"]})"),
              HasSubstr("port \"+80\" is not a number"));
}

TEST(ClusterSpecTest, EmptyHost) {
  EXPECT_THAT(ParseError(R"({"ps": [":2222"], "worker": ["b:1"]})"),
              HasSubstr("bad address \":2222\": empty host"));
  EXPECT_THAT(ParseError(R"({"ps": ["[]:2222"], "worker": ["b:1"]})"),
              HasSubstr("bad address \"[]:2222\": empty host"));
}

TEST(ClusterSpecTest, UnbracketedIpv6) {
  EXPECT_THAT(ParseError(R"({"ps": ["::1:2222"], "worker": ["b:1"]})"),
              AllOf(HasSubstr("bad address \"::1:2222\""),
                    HasSubstr("must be bracketed")));
}

TEST(ClusterSpecTest, BadHostCharacter) {
  EXPECT_THAT(ParseError(R"({"ps": ["http://a:1"], "worker": ["b:1"]})"),
              HasSubstr("bad address \"http://a:1\""));
}

TEST(ClusterSpecTest, DuplicateAddress) {
  EXPECT_THAT(ParseError(R"({"ps": ["a:1", "b:1"], "worker": ["c:1", "b:1"]})"),
              AllOf(HasSubstr("duplicate address \"b:1\""),
                    HasSubstr("ps/1"), HasSubstr("worker/1")));
}

TEST(ClusterSpecTest, UnknownTopLevelFieldInTfConfig) {
  EXPECT_THAT(
      ParseError(R"({"cluster": {"ps": ["a:1"], "worker": ["b:1"]},
                     "tasks": {"type": "worker", "index": 0}})",
                 "TF_CONFIG"),
      HasSubstr("unknown field \"tasks\""));
}

TEST(ClusterSpecTest, TaskWithoutCluster) {
  EXPECT_THAT(ParseError(R"({"task": {"type": "worker", "index": 0}})",
                         "TF_CONFIG"),
              HasSubstr("no \"cluster\""));
}

TEST(ClusterSpecTest, TaskTypeNotAString) {
  EXPECT_THAT(
      ParseError(R"({"cluster": {"ps": ["a:1"], "worker": ["b:1"]},
                     "task": {"type": 1, "index": 0}})",
                 "TF_CONFIG"),
      HasSubstr("task \"type\" must be a string, got the number 1"));
}

TEST(ClusterSpecTest, TaskTypeUnknownJob) {
  EXPECT_THAT(
      ParseError(R"({"cluster": {"ps": ["a:1"], "worker": ["b:1"]},
                     "task": {"type": "master", "index": 0}})",
                 "TF_CONFIG"),
      AllOf(HasSubstr("unknown job \"master\""),
            HasSubstr("chief, evaluator, ps, worker")));
}

TEST(ClusterSpecTest, TaskTypeJobNotInCluster) {
  EXPECT_THAT(
      ParseError(R"({"cluster": {"ps": ["a:1"], "worker": ["b:1"]},
                     "task": {"type": "chief", "index": 0}})",
                 "TF_CONFIG"),
      HasSubstr("task chief/0: the cluster has no job \"chief\""));
}

TEST(ClusterSpecTest, TaskIndexNotAnInteger) {
  const char* kCluster = R"({"cluster": {"ps": ["a:1"], "worker": ["b:1", "c:1"]},
                             "task": {"type": "worker", "index": )";
  EXPECT_THAT(ParseError(std::string(kCluster) + "1.5}}", "TF_CONFIG"),
              HasSubstr("task \"index\" must be a non-negative integer, got "
                        "the number 1.5"));
  EXPECT_THAT(ParseError(std::string(kCluster) + "-1}}", "TF_CONFIG"),
              HasSubstr("task \"index\" must be a non-negative integer"));
  EXPECT_THAT(ParseError(std::string(kCluster) + "\"0\"}}", "TF_CONFIG"),
              HasSubstr("got the string \"0\""));
  EXPECT_THAT(ParseError(std::string(kCluster) + "1e30}}", "TF_CONFIG"),
              HasSubstr("task \"index\""));
}

TEST(ClusterSpecTest, TaskIndexMissing) {
  EXPECT_THAT(
      ParseError(R"({"cluster": {"ps": ["a:1"], "worker": ["b:1"]},
                     "task": {"type": "worker"}})",
                 "TF_CONFIG"),
      HasSubstr("missing \"index\""));
}

TEST(ClusterSpecTest, TaskIndexOutOfRange) {
  EXPECT_EQ(
      ParseError(R"({"cluster": {"ps": ["a:1"], "worker": ["b:1", "c:1"]},
                     "task": {"type": "worker", "index": 2}})",
                 "TF_CONFIG"),
      "TF_CONFIG: task worker/2: index 2 out of range for job \"worker\" "
      "(valid range 0..1)");
}

TEST(ClusterSpecTest, ValidateTask) {
  auto spec = ClusterSpec::Parse(R"({"ps": ["a:1"], "worker": ["b:1"]})",
                                 kSource);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->ValidateTask({"ps", 0}).ok());
  absl::Status s = spec->ValidateTask({"ps", 1});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), AllOf(StartsWith(kSource), HasSubstr("ps/1"),
                                 HasSubstr("valid range 0..0")));
  EXPECT_THAT(std::string(spec->ValidateTask({"worker", -1}).message()),
              HasSubstr("valid range 0..0"));
  EXPECT_THAT(std::string(spec->ValidateTask({"foo", 0}).message()),
              HasSubstr("unknown job \"foo\""));
}

TEST(ClusterSpecSplitHostPortTest, Splits) {
  std::string host;
  int port = 0;
  ASSERT_TRUE(SplitHostPort("localhost:2222", &host, &port).ok());
  EXPECT_EQ(host, "localhost");
  EXPECT_EQ(port, 2222);
  ASSERT_TRUE(SplitHostPort("[::1]:65535", &host, &port).ok());
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, 65535);
  ASSERT_TRUE(SplitHostPort("10.1.2.3:1", &host, &port).ok());
  EXPECT_EQ(host, "10.1.2.3");
  EXPECT_EQ(port, 1);
}

TEST(ClusterSpecSplitHostPortTest, Refuses) {
  std::string host;
  int port = 0;
  for (const char* bad : {"", "a", "a:", ":1", "a:0", "a:65536",
                          "a:99999999999999999999", "a:1x", "a: 1", "::1:1",
                          "[::1", "[::1]", "[::1]x:1", "a b:1"}) {
    absl::Status s = SplitHostPort(bad, &host, &port);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(std::string("bad address \"") + bad + "\""));
  }
}

// ---- ResolveClusterConfig ----

constexpr char kTfConfig[] =
    R"({"cluster": {"ps": ["a:1"], "worker": ["b:1", "c:1"]},
        "task": {"type": "worker", "index": 1}})";

TEST(ClusterSpecResolveTest, FromTfConfig) {
  auto config = ResolveClusterConfig("", kTfConfig, "", 0);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->task.ToString(), "worker/1");
  EXPECT_EQ(config->spec.num_tasks("worker"), 2);
}

TEST(ClusterSpecResolveTest, FlagsOverrideTfConfigTask) {
  auto config = ResolveClusterConfig("", kTfConfig, "ps", 0);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->task.ToString(), "ps/0");
}

TEST(ClusterSpecResolveTest, FileWinsOverTfConfig) {
  const std::string path = WriteFile(
      "resolve_spec.json", R"({"ps": ["x:1", "y:1"], "worker": ["z:1"]})");
  auto config = ResolveClusterConfig(path, kTfConfig, "ps", 1);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->spec.num_ps(), 2);
  EXPECT_EQ(config->task.ToString(), "ps/1");
}

TEST(ClusterSpecResolveTest, FileWithTask) {
  const std::string path = WriteFile("resolve_spec_task.json", kTfConfig);
  auto config = ResolveClusterConfig(path, "", "", 0);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->task.ToString(), "worker/1");
}

TEST(ClusterSpecResolveTest, NoCluster) {
  auto config = ResolveClusterConfig("", "", "worker", 0);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(config.status().message(),
            "no cluster: pass --cluster_spec=FILE or set TF_CONFIG");
}

TEST(ClusterSpecResolveTest, NoTask) {
  const std::string path = WriteFile(
      "resolve_spec_no_task.json", R"({"ps": ["x:1"], "worker": ["z:1"]})");
  auto config = ResolveClusterConfig(path, "", "", 0);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()),
              AllOf(StartsWith("cluster spec file " + path + ": "),
                    HasSubstr("no task")));
}

TEST(ClusterSpecResolveTest, FlagTaskOutOfRange) {
  auto config = ResolveClusterConfig("", kTfConfig, "worker", 5);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()),
              AllOf(StartsWith("TF_CONFIG: "), HasSubstr("worker/5"),
                    HasSubstr("valid range 0..1")));
}

TEST(ClusterSpecResolveTest, UnreadableFile) {
  const std::string path = testing::TempDir() + "/missing_dir/spec.json";
  auto config = ResolveClusterConfig(path, kTfConfig, "", 0);
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(path));
}

TEST(ClusterSpecResolveTest, BadTfConfig) {
  auto config = ResolveClusterConfig("", "{not json", "", 0);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()),
              StartsWith("TF_CONFIG: invalid JSON: "));
}

}  // namespace
}  // namespace psrt
