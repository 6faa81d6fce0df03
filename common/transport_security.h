// TransportSecurity: how every psrt gRPC endpoint protects its connections,
// in one place for the parameter servers, the workers and psrtctl.
//
// Two independent layers, each optional:
//  - Mutual TLS. Every task presents a certificate signed by the cluster's
//    CA, and checks its peer's: a server refuses a client without such a
//    certificate (GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY),
//    a client checks that the server's certificate is signed by the CA and
//    names the host it dialed (a SAN DNS name or IP address).
//  - An auth token: a shared secret that every RPC carries as the metadata
//    "authorization: Bearer <token>". One mechanism, with or without TLS:
//    the client side attaches it with a channel interceptor (gRPC sends call
//    credentials only over TLS), and the server side checks it in gRPC's
//    auth metadata processor, in constant time, before any service sees the
//    call; a call without the right token ends UNAUTHENTICATED, and the
//    header is consumed so that no handler ever sees it. Without TLS the
//    token travels in cleartext: use it alone only on a trusted network.
//    Tokens are compared as SHA-256 digests, so the time a check takes
//    tells nothing of the token, its length included.
//  - Roles, with a second token for the chief (--chief_token_file): servers
//    accept either token, and mark calls made with the chief's; the ps
//    then takes Init, Save, Restore and the end of training from those
//    alone, so a worker's credentials cannot reset, roll back or stop a
//    job. Workers are given the auth token only.
//
// Loading reads and checks every file at start, so a misconfiguration (a
// certificate without its key, an unreadable file, bad PEM, a key that does
// not match its certificate, a certificate the CA did not sign, an empty
// token) is an error naming the flag and the file, not a failed handshake
// later. The token itself is never printed: no accessor returns it, and no
// error message or log line contains it.
//
// Thread safety: immutable once loaded; share it freely (const).
#ifndef PSRT_COMMON_TRANSPORT_SECURITY_H_
#define PSRT_COMMON_TRANSPORT_SECURITY_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/support/client_interceptor.h"

namespace psrt {

// Where the secrets come from: file paths, filled from --tls_cert, --tls_key,
// --tls_ca and --auth_token_file (errors name those flags), plus the token
// itself when it comes from the environment (PSRT_AUTH_TOKEN).
struct TransportSecurityOptions {
  std::string tls_cert_file;  // PEM certificate chain this task presents.
  std::string tls_key_file;   // PEM private key of that certificate.
  std::string tls_ca_file;    // PEM certificate(s) of the cluster's CA.
  std::string auth_token_file;
  // The token itself, when set (even empty); at most one of these two.
  std::optional<std::string> auth_token;
  // The chief's own token (--chief_token_file, PSRT_CHIEF_TOKEN), for roles.
  std::string chief_token_file;
  std::optional<std::string> chief_token;
};

// The auth property a server puts on a call that came with the chief's
// token (grpc::AuthContext::FindPropertyValues).
inline constexpr char kChiefRoleProperty[] = "psrt_role";

// Listeners told when this process's servers refuse a call for a missing or
// wrong auth token, with the refused method ("/psrt.proto.Collective/Deliver"):
// a peer whose calls are refused may wait for them forever otherwise (the
// allreduce ring fails at once instead). A listener runs on gRPC's thread
// and must not block. Thread-safe.
int AddRefusedCallListener(std::function<void(absl::string_view method)> listener);
void RemoveRefusedCallListener(int id);

class TransportSecurity {
 public:
  // Plaintext, no token: what an empty TransportSecurityOptions loads.
  TransportSecurity() = default;

  bool tls() const { return !cert_pem_.empty(); }
  bool has_auth_token() const { return !authorization_.empty(); }
  // A chief token is set: servers accept it besides the workers' token and
  // mark its calls as the chief's, which alone may Init, Save, Restore and
  // end training (PsService).
  bool has_chief_token() const { return !chief_authorization_.empty(); }
  // The same, presenting the chief's token on its calls (when it has one):
  // for the chief and for operators (psrtctl).
  TransportSecurity ForChief() const;
  // "mutual TLS + auth token", "plaintext, no auth token", ...: for logs.
  std::string Describe() const;

  // For grpc::ServerBuilder::AddListeningPort: TLS that requires and
  // verifies client certificates, and the token check, as configured.
  std::shared_ptr<grpc::ServerCredentials> ServerCredentials() const;
  // For dialing a psrt server: TLS with this task's certificate, verifying
  // the server against the CA (or plaintext).
  std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials() const;
  // For grpc::experimental::CreateCustomChannelWithInterceptors: attaches
  // the token to every call (none without a token).
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
  ClientInterceptors() const;

  // The tensor data plane (dataplane/), which has no TLS: what a client
  // presents in its hello (the token it would attach to a call; empty
  // without one), and the server's check of it: OK for the workers' or the
  // chief's token (compared in constant time; `chief` says which),
  // Unauthenticated for anything else. Without a token, anything passes.
  std::string DataPlaneCredential() const;
  absl::Status CheckDataPlaneCredential(absl::string_view presented, bool* chief) const;

 private:
  friend absl::StatusOr<TransportSecurity> LoadTransportSecurity(
      const TransportSecurityOptions& options);

  std::string ca_pem_, cert_pem_, key_pem_;
  std::string authorization_;  // "Bearer <token>"; empty: no token.
  std::string chief_authorization_;  // The chief's; empty: no roles.
  bool as_chief_ = false;  // Calls present chief_authorization_.
};

// Reads and checks every file named in `options` (see the header comment).
// InvalidArgument (or NotFound / PermissionDenied for files) naming the flag
// and the file. Warns when a key or token file is readable by every user;
// refuses one that every user may write.
absl::StatusOr<TransportSecurity> LoadTransportSecurity(
    const TransportSecurityOptions& options);

}  // namespace psrt

#endif  // PSRT_COMMON_TRANSPORT_SECURITY_H_
