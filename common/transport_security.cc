#include "common/transport_security.h"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <sys/stat.h>

#include <cerrno>
#include <functional>
#include <map>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/file_system.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "grpc/grpc.h"
#include "grpc/grpc_security.h"
#include "grpc/slice.h"

namespace psrt {
namespace {

constexpr char kAuthorizationKey[] = "authorization";
constexpr char kBearerPrefix[] = "Bearer ";

// ---------------------------------------------------------------- files

// A file named by a flag: "--tls_key=/path" in every message about it.
struct FlagFile {
  const char* flag;
  std::string path;
  std::string Name() const { return absl::StrCat("--", flag, "=", path); }
};

// Reads `file`. Secret files (keys, the token) must not be writable by every
// user, and a warning says so when every user may read them.
absl::StatusOr<std::string> ReadFlagFile(const FlagFile& file, bool secret) {
  struct stat info;
  if (::stat(file.path.c_str(), &info) != 0) {
    const std::string why = std::strerror(errno);
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(file.Name(), ": ", why));
    return absl::PermissionDeniedError(absl::StrCat(file.Name(), ": ", why));
  }
  if (!S_ISREG(info.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(file.Name(), " is not a regular file"));
  }
  const int mode = info.st_mode & 07777;
  if (secret && (mode & S_IWOTH)) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "%s is writable by every user (mode %04o): chmod 600 it", file.Name(), mode));
  }
  if (secret && (mode & S_IROTH)) {
    LOG(WARNING) << absl::StrFormat("%s is readable by every user (mode %04o): chmod 600 it",
                                    file.Name(), mode);
  }
  absl::StatusOr<std::string> contents = FileSystem::Default()->ReadFile(file.path);
  if (!contents.ok()) {
    return absl::PermissionDeniedError(
        absl::StrCat(file.Name(), ": ", contents.status().message()));
  }
  return contents;
}

// ---------------------------------------------------------------- PEM checks

struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
using X509Ptr = std::unique_ptr<X509, X509Deleter>;
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyDeleter>;
using BioPtr = std::unique_ptr<BIO, BioDeleter>;

// OpenSSL's reason for the last failure, and a clean error queue.
std::string TakeOpenSslError() {
  const unsigned long code = ERR_peek_last_error();
  ERR_clear_error();
  if (code == 0) return "unknown error";
  return ERR_reason_error_string(code) ? ERR_reason_error_string(code) : "unknown error";
}

BioPtr MemoryBio(const std::string& pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// Every certificate in `pem`, in order; at least one.
absl::StatusOr<std::vector<X509Ptr>> ParseCertificates(const FlagFile& file,
                                                       const std::string& pem) {
  ERR_clear_error();
  BioPtr bio = MemoryBio(pem);
  std::vector<X509Ptr> certs;
  while (X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    certs.emplace_back(cert);
  }
  // Running out of PEM blocks is the normal end; anything else is damage.
  const unsigned long end = ERR_peek_last_error();
  if (ERR_GET_LIB(end) != ERR_LIB_PEM || ERR_GET_REASON(end) != PEM_R_NO_START_LINE) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.Name(), ": bad PEM certificate (", TakeOpenSslError(), ")"));
  }
  ERR_clear_error();
  if (certs.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.Name(), ": no PEM certificate (-----BEGIN CERTIFICATE-----) in it"));
  }
  return certs;
}

absl::StatusOr<KeyPtr> ParsePrivateKey(const FlagFile& file, const std::string& pem) {
  ERR_clear_error();
  BioPtr bio = MemoryBio(pem);
  // No passphrase: an encrypted key fails here instead of prompting.
  pem_password_cb* no_passphrase = [](char*, int, int, void*) { return 0; };
  KeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, no_passphrase, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        file.Name(), ": not an unencrypted PEM private key (", TakeOpenSslError(), ")"));
  }
  return key;
}

// The key must belong to the leaf certificate, and the chain must lead to one
// of the CA's certificates: otherwise every peer would refuse this task.
absl::Status CheckKeyAndChain(const FlagFile& cert_file, const std::vector<X509Ptr>& chain,
                              const FlagFile& key_file, EVP_PKEY* key,
                              const FlagFile& ca_file, const std::vector<X509Ptr>& cas) {
  if (X509_check_private_key(chain[0].get(), key) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat(
        key_file.Name(), " is not the key of the certificate in ", cert_file.Name()));
  }
  std::unique_ptr<X509_STORE, decltype(&X509_STORE_free)> store(X509_STORE_new(),
                                                                 &X509_STORE_free);
  for (const X509Ptr& ca : cas) X509_STORE_add_cert(store.get(), ca.get());
  // The stack borrows the certificates: free it, not them.
  auto free_stack = [](STACK_OF(X509) * stack) { sk_X509_free(stack); };
  std::unique_ptr<STACK_OF(X509), decltype(free_stack)> intermediates(sk_X509_new_null(),
                                                                      free_stack);
  for (size_t i = 1; i < chain.size(); ++i) sk_X509_push(intermediates.get(), chain[i].get());
  std::unique_ptr<X509_STORE_CTX, decltype(&X509_STORE_CTX_free)> context(
      X509_STORE_CTX_new(), &X509_STORE_CTX_free);
  X509_STORE_CTX_init(context.get(), store.get(), chain[0].get(), intermediates.get());
  const bool verified = X509_verify_cert(context.get()) == 1;
  const int error = X509_STORE_CTX_get_error(context.get());
  ERR_clear_error();
  if (!verified) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the certificate in ", cert_file.Name(), " does not verify against the CA in ",
        ca_file.Name(), ": ", X509_verify_cert_error_string(error)));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- the token

// A token from its file (flag `flag`) or the environment (`env`), checked;
// empty when neither is given.
absl::StatusOr<std::string> LoadToken(const char* flag, const std::string& path,
                                      const std::optional<std::string>& value,
                                      const char* env) {
  const bool from_file = !path.empty();
  if (from_file && value.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("both --", flag, " and ", env, " are set: use one of them"));
  }
  if (!from_file && !value.has_value()) return std::string();
  const FlagFile file{flag, path};
  const std::string source = from_file ? file.Name() : env;
  std::string token;
  if (from_file) {
    ASSIGN_OR_RETURN(token, ReadFlagFile(file, /*secret=*/true));
  } else {
    token = *value;
  }
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": the token is empty"));
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {  // What an HTTP/2 header value carries.
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": the token may hold only printable ASCII characters, "
                  "no spaces"));
    }
  }
  return token;
}

// ---------------------------------------------------------------- gRPC side

// SHA-256 of `text`: tokens are compared as digests, so the comparison's
// time says nothing about a token's length or contents.
std::string Digest(absl::string_view text) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  CHECK_EQ(EVP_Digest(text.data(), text.size(), digest, &size, EVP_sha256(), nullptr), 1);
  return std::string(reinterpret_cast<const char*>(digest), size);
}

// What the server's check accepts: digests of "Bearer <token>" for the
// workers' token and (when set) the chief's.
// AddRefusedCallListener's listeners.
struct RefusedCallListeners {
  absl::Mutex mu;
  int next_id ABSL_GUARDED_BY(mu) = 0;
  std::map<int, std::function<void(absl::string_view)>> listeners ABSL_GUARDED_BY(mu);
};

RefusedCallListeners& Listeners() {
  static RefusedCallListeners* const listeners = new RefusedCallListeners;
  return *listeners;
}

void TellRefused(absl::string_view method) {
  RefusedCallListeners& all = Listeners();
  absl::MutexLock lock(&all.mu);
  for (const auto& [id, listener] : all.listeners) listener(method);
}

struct AcceptedTokens {
  std::string worker;
  std::string chief;  // Empty: no chief token, no roles.
};

// gRPC's auth metadata processor: lets a call through when its
// "authorization" metadata is one of the accepted tokens (digests compared
// in constant time), marks a call with the chief's token with the auth
// property kChiefRoleProperty, and consumes that metadata so no handler sees
// it.
void CheckAuthorization(void* state, grpc_auth_context* context, const grpc_metadata* md,
                        size_t num_md, grpc_process_auth_metadata_done_cb done,
                        void* user_data) {
  const AcceptedTokens& accepted = *static_cast<const AcceptedTokens*>(state);
  // The standard health service answers without a token: Kubernetes' gRPC
  // probes cannot send one, and a serving status tells nothing secret.
  absl::string_view method;
  for (size_t i = 0; i < num_md; ++i) {
    if (grpc_slice_str_cmp(md[i].key, ":path") != 0) continue;
    method = absl::string_view(reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(md[i].value)),
                               GRPC_SLICE_LENGTH(md[i].value));
    if (grpc_slice_str_cmp(md[i].value, "/grpc.health.v1.Health/Check") == 0 ||
        grpc_slice_str_cmp(md[i].value, "/grpc.health.v1.Health/Watch") == 0) {
      done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_OK, nullptr);
      return;
    }
  }
  for (size_t i = 0; i < num_md; ++i) {
    if (grpc_slice_str_cmp(md[i].key, kAuthorizationKey) != 0) continue;
    const std::string presented = Digest(absl::string_view(
        reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(md[i].value)),
        GRPC_SLICE_LENGTH(md[i].value)));
    const bool chief = !accepted.chief.empty() &&
                       CRYPTO_memcmp(presented.data(), accepted.chief.data(),
                                     presented.size()) == 0;
    const bool worker =
        CRYPTO_memcmp(presented.data(), accepted.worker.data(), presented.size()) == 0;
    if (chief || worker) {
      if (chief) grpc_auth_context_add_cstring_property(context, kChiefRoleProperty, "chief");
      done(user_data, &md[i], 1, nullptr, 0, GRPC_STATUS_OK, nullptr);
      return;
    }
    break;
  }
  // Who it was, as far as TLS tells (a client certificate's name).
  grpc_auth_property_iterator identity = grpc_auth_context_peer_identity(context);
  const grpc_auth_property* name = grpc_auth_property_iterator_next(&identity);
  LOG_EVERY_T(WARNING, 10) << "refused a call without the right auth token from "
                           << (name ? std::string(name->value, name->value_length)
                                    : "a peer without a client certificate");
  TellRefused(method);
  done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_UNAUTHENTICATED,
       "unauthenticated: this server requires the cluster's auth token "
       "(--auth_token_file or PSRT_AUTH_TOKEN), and the call has none or a wrong one");
}

// Server credentials (TLS or plaintext) with the token check built in.
// gRPC's InsecureServerCredentials() refuses an auth metadata processor, so
// this wraps gRPC's core credentials itself: the one way to run the same
// check with and without TLS. Written against gRPC 1.51's ServerCredentials
// interface (Debian 12's libgrpc++).
class CheckedServerCredentials final : public grpc::ServerCredentials {
 public:
  // Empty `cert_pem`: plaintext. Empty `authorization`: no token check;
  // else `chief_authorization` (may be empty) is accepted too.
  CheckedServerCredentials(const std::string& ca_pem, const std::string& cert_pem,
                           const std::string& key_pem, const std::string& authorization,
                           const std::string& chief_authorization) {
    if (cert_pem.empty()) {
      creds_ = grpc_insecure_server_credentials_create();
    } else {
      grpc_ssl_pem_key_cert_pair pair = {key_pem.c_str(), cert_pem.c_str()};
      creds_ = grpc_ssl_server_credentials_create_ex(
          ca_pem.c_str(), &pair, 1, GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY,
          nullptr);
    }
    CHECK(creds_ != nullptr);
    if (!authorization.empty()) {
      auto* accepted = new AcceptedTokens{
          Digest(authorization),
          chief_authorization.empty() ? std::string() : Digest(chief_authorization)};
      grpc_server_credentials_set_auth_metadata_processor(
          creds_, {&CheckAuthorization,
                   [](void* state) { delete static_cast<AcceptedTokens*>(state); },
                   accepted});
    }
  }
  ~CheckedServerCredentials() override { grpc_server_credentials_release(creds_); }

  void SetAuthMetadataProcessor(
      const std::shared_ptr<grpc::AuthMetadataProcessor>& /*processor*/) override {
    LOG(FATAL) << "psrt's server credentials carry their own token check";
  }

 private:
  int AddPortToServer(const std::string& address, grpc_server* server) override {
    return grpc_server_add_http2_port(server, address.c_str(), creds_);
  }

  grpc_server_credentials* creds_ = nullptr;
};

// Adds "authorization: Bearer <token>" to every call of a channel.
class TokenAttacher final : public grpc::experimental::Interceptor {
 public:
  explicit TokenAttacher(std::string authorization) : authorization_(std::move(authorization)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace(kAuthorizationKey, authorization_);
    }
    methods->Proceed();
  }

 private:
  const std::string authorization_;
};

class TokenAttacherFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenAttacherFactory(std::string authorization)
      : authorization_(std::move(authorization)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new TokenAttacher(authorization_);
  }

 private:
  const std::string authorization_;
};

}  // namespace

int AddRefusedCallListener(std::function<void(absl::string_view method)> listener) {
  RefusedCallListeners& all = Listeners();
  absl::MutexLock lock(&all.mu);
  const int id = all.next_id++;
  all.listeners.emplace(id, std::move(listener));
  return id;
}

void RemoveRefusedCallListener(int id) {
  RefusedCallListeners& all = Listeners();
  absl::MutexLock lock(&all.mu);
  all.listeners.erase(id);
}

std::string TransportSecurity::Describe() const {
  return absl::StrCat(tls() ? "mutual TLS" : "plaintext",
                      has_auth_token() ? " + auth token" : ", no auth token",
                      has_chief_token() ? " + chief token (roles)" : "");
}

std::shared_ptr<grpc::ServerCredentials> TransportSecurity::ServerCredentials() const {
  if (!tls() && !has_auth_token()) return grpc::InsecureServerCredentials();
  return std::make_shared<CheckedServerCredentials>(ca_pem_, cert_pem_, key_pem_,
                                                    authorization_, chief_authorization_);
}

std::shared_ptr<grpc::ChannelCredentials> TransportSecurity::ChannelCredentials() const {
  if (!tls()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = ca_pem_;
  options.pem_private_key = key_pem_;
  options.pem_cert_chain = cert_pem_;
  return grpc::SslCredentials(options);
}

std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
TransportSecurity::ClientInterceptors() const {
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> out;
  const std::string& token = as_chief_ ? chief_authorization_ : authorization_;
  if (!token.empty()) out.push_back(std::make_unique<TokenAttacherFactory>(token));
  return out;
}

std::string TransportSecurity::DataPlaneCredential() const {
  return as_chief_ ? chief_authorization_ : authorization_;
}

absl::Status TransportSecurity::CheckDataPlaneCredential(absl::string_view presented,
                                                         bool* chief) const {
  *chief = false;
  if (authorization_.empty()) return absl::OkStatus();
  const std::string digest = Digest(presented);
  *chief = !chief_authorization_.empty() &&
           CRYPTO_memcmp(digest.data(), Digest(chief_authorization_).data(), digest.size()) == 0;
  if (*chief ||
      CRYPTO_memcmp(digest.data(), Digest(authorization_).data(), digest.size()) == 0) {
    return absl::OkStatus();
  }
  LOG_EVERY_T(WARNING, 10) << "refused a data-plane connection without the right auth token";
  return absl::UnauthenticatedError(
      "unauthenticated: this server requires the cluster's auth token "
      "(--auth_token_file or PSRT_AUTH_TOKEN), and the data-plane connection has none or a "
      "wrong one");
}

TransportSecurity TransportSecurity::ForChief() const {
  TransportSecurity chief = *this;
  chief.as_chief_ = has_chief_token();
  return chief;
}

absl::StatusOr<TransportSecurity> LoadTransportSecurity(
    const TransportSecurityOptions& options) {
  TransportSecurity security;
  ASSIGN_OR_RETURN(std::string token, LoadToken("auth_token_file", options.auth_token_file,
                                                 options.auth_token, "PSRT_AUTH_TOKEN"));
  if (!token.empty()) security.authorization_ = absl::StrCat(kBearerPrefix, token);
  ASSIGN_OR_RETURN(std::string chief, LoadToken("chief_token_file", options.chief_token_file,
                                                 options.chief_token, "PSRT_CHIEF_TOKEN"));
  if (!chief.empty()) {
    if (token.empty()) {
      return absl::InvalidArgumentError(
          "a chief token (--chief_token_file or PSRT_CHIEF_TOKEN) needs the workers' "
          "auth token too (--auth_token_file or PSRT_AUTH_TOKEN)");
    }
    if (chief == token) {
      return absl::InvalidArgumentError(
          "the chief token equals the workers' auth token: give the chief its own");
    }
    security.chief_authorization_ = absl::StrCat(kBearerPrefix, chief);
  }

  const FlagFile cert{"tls_cert", options.tls_cert_file};
  const FlagFile key{"tls_key", options.tls_key_file};
  const FlagFile ca{"tls_ca", options.tls_ca_file};
  std::vector<std::string> missing;
  for (const FlagFile* f : {&cert, &key, &ca}) {
    if (f->path.empty()) missing.push_back(absl::StrCat("--", f->flag));
  }
  if (missing.size() == 3) return security;
  if (!missing.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mutual TLS needs --tls_cert, --tls_key and --tls_ca; missing: ",
        absl::StrJoin(missing, ", ")));
  }
  ASSIGN_OR_RETURN(security.cert_pem_, ReadFlagFile(cert, /*secret=*/false));
  ASSIGN_OR_RETURN(security.key_pem_, ReadFlagFile(key, /*secret=*/true));
  ASSIGN_OR_RETURN(security.ca_pem_, ReadFlagFile(ca, /*secret=*/false));
  ASSIGN_OR_RETURN(std::vector<X509Ptr> chain, ParseCertificates(cert, security.cert_pem_));
  ASSIGN_OR_RETURN(KeyPtr private_key, ParsePrivateKey(key, security.key_pem_));
  ASSIGN_OR_RETURN(std::vector<X509Ptr> cas, ParseCertificates(ca, security.ca_pem_));
  RETURN_IF_ERROR(CheckKeyAndChain(cert, chain, key, private_key.get(), ca, cas));
  return security;
}

}  // namespace psrt
