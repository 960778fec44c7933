#include "cli/commands.h"
#include "bench/serve_bench.h"

namespace moeshard {

const std::vector<ClusterCommand>& ClusterCommands() {
  static const std::vector<ClusterCommand> commands = {
      {"up", "start workers, coordinator(s) and the router on this machine", UpCommand},
      {"bench", "benchmarks against a running cluster: `bench serve --url URL`", BenchCommand},
  };
  return commands;
}

}  // namespace moeshard
