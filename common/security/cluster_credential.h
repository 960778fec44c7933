// The cluster credential: a random token that `moeshard up` makes for each cluster it
// starts (Kubernetes takes it from a Secret) and that every internal gRPC call carries —
// router -> coordinator, coordinator -> worker, worker -> the coordinator's store. It
// reaches a process through the environment or a file, never through argv (which `ps`
// shows to every user of the machine).
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace moeshard {

inline constexpr char kClusterTokenEnv[] = "MOESHARD_CLUSTER_TOKEN";
inline constexpr char kClusterTokenFileEnv[] = "MOESHARD_CLUSTER_TOKEN_FILE";
// The gRPC metadata key the token travels under.
inline constexpr char kClusterTokenMetadataKey[] = "x-moeshard-cluster-token";
// A token shorter than this is refused (the generated ones have 64 hex digits).
inline constexpr size_t kMinClusterTokenChars = 16;

// 32 bytes from the kernel's random source, as 64 hex digits.
absl::StatusOr<std::string> GenerateClusterToken();

// A secret file's content without surrounding white space; an error names the file (never
// its content) when it cannot be read or is empty.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path, const std::string& what);

// The token from $MOESHARD_CLUSTER_TOKEN, else the file `file_flag` names, else the file
// $MOESHARD_CLUSTER_TOKEN_FILE names; NotFound when none is given, InvalidArgument when it
// is too short or holds characters that gRPC metadata cannot carry.
absl::StatusOr<std::string> LoadClusterToken(const std::string& file_flag);

// Equal strings, in time that depends only on their lengths.
bool SecretEquals(std::string_view a, std::string_view b);

// True when `authorization` (an HTTP header or gRPC metadata value) is "Bearer <secret>";
// compared in constant time.
bool BearerEquals(std::string_view authorization, std::string_view secret);

}  // namespace moeshard
