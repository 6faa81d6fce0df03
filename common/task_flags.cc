#include "common/task_flags.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gflags/gflags.h"
#include "glog/logging.h"

DEFINE_string(tls_cert, "",
              "PEM certificate (chain) this task presents to its peers, signed "
              "by --tls_ca. With --tls_key and --tls_ca: mutual TLS on every "
              "connection (scripts/make_test_certs.sh makes test ones).");
DEFINE_string(tls_key, "", "PEM private key of --tls_cert (unencrypted; chmod 600).");
DEFINE_string(tls_ca, "",
              "PEM certificate of the cluster's CA: peers must present a "
              "certificate it signed, and servers one naming their host.");
DEFINE_string(auth_token_file, "",
              "File holding the cluster's shared auth token (one line); every "
              "RPC must carry it. The PSRT_AUTH_TOKEN environment variable "
              "works instead. Empty and unset: no token.");

DEFINE_string(chief_token_file, "",
              "File holding the chief's own token (one line), besides the "
              "workers' --auth_token_file: parameter servers then take Init, "
              "Save, Restore and the end of training only from calls with it. "
              "Give it to the chief, the ps tasks and operators (psrtctl), not "
              "to other workers. PSRT_CHIEF_TOKEN works instead.");
DEFINE_int32(ps_stripes, 2,
             "Shards each ps process serves, each over its own connection: a "
             "large model then moves as several concurrent streams. Give every "
             "task of a job (ps, workers, evaluator) the same value; "
             "checkpoints are per shard, so a job resumes with the value it "
             "saved with.");

namespace psrt {

absl::StatusOr<int> PsStripesFromFlags() {
  if (FLAGS_ps_stripes < 1 || FLAGS_ps_stripes > kMaxPsStripes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--ps_stripes must be in 1..", kMaxPsStripes, ", got ", FLAGS_ps_stripes));
  }
  return FLAGS_ps_stripes;
}

absl::StatusOr<std::shared_ptr<const TransportSecurity>> TransportSecurityFromFlags(
    bool serves) {
  TransportSecurityOptions options;
  options.tls_cert_file = FLAGS_tls_cert;
  options.tls_key_file = FLAGS_tls_key;
  options.tls_ca_file = FLAGS_tls_ca;
  options.auth_token_file = FLAGS_auth_token_file;
  if (const char* token = std::getenv("PSRT_AUTH_TOKEN")) options.auth_token = token;
  options.chief_token_file = FLAGS_chief_token_file;
  if (const char* token = std::getenv("PSRT_CHIEF_TOKEN")) options.chief_token = token;
  ASSIGN_OR_RETURN(TransportSecurity security, LoadTransportSecurity(options));
  if (security.has_auth_token() && !security.tls()) {
    LOG(WARNING) << "auth token without TLS: the token travels in cleartext; "
                    "add --tls_cert, --tls_key and --tls_ca on untrusted networks";
  }
  if (security.tls() || security.has_auth_token()) {
    LOG(INFO) << "transport security: " << security.Describe();
  } else if (serves) {
    LOG(WARNING) << "no TLS and no auth token: anyone who can reach this task's port can "
                    "push, pull, checkpoint, restore or end the job. Fine on a trusted "
                    "network or one machine; elsewhere set --tls_cert, --tls_key and "
                    "--tls_ca and an auth token (--auth_token_file or PSRT_AUTH_TOKEN; "
                    "scripts/make_test_certs.sh makes a test CA)";
  }
  return std::make_shared<const TransportSecurity>(std::move(security));
}

}  // namespace psrt
